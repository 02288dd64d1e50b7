// Command dra-prepare-client is bench/dra_prepare.py's kubelet side: a Go gRPC client, as kubelet
// is, so that the figures carry the plugin's cost and gRPC's, not a Python client's own CPU on the
// same machine.
//
// On one connection it sends one NodePrepareResources per claim (one pod each), all at once, then
// one NodeUnprepareResources per claim, all at once: first a warm-up round of the claims
// c<claims>..c<claims+warmup-1>, then the measured round of c0..c<claims-1>. It prints one JSON
// object: each measured call's latency in milliseconds (from just before the call to its answer)
// and each round's wall time. A claim answered with an error ends the program with that error.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
)

type result struct {
	PrepareMs     []float64 `json:"prepare_ms"`
	UnprepareMs   []float64 `json:"unprepare_ms"`
	PrepareWallS  float64   `json:"prepare_wall_s"`
	UnprepareWall float64   `json:"unprepare_wall_s"`
}

func claim(namespace string, i int) *drapb.Claim {
	return &drapb.Claim{Namespace: namespace, Name: fmt.Sprintf("c%d", i), Uid: fmt.Sprintf("uid-%d", i)}
}

// round calls one RPC per claim of [first, first+count), all released at once; each call's
// latency in ms, the round's wall time in seconds, and the first error.
func round(first, count int, call func(ctx context.Context, i int) error) ([]float64, float64, error) {
	latencies := make([]float64, count)
	errs := make([]error, count)
	var ready, done sync.WaitGroup
	start := make(chan struct{})
	ready.Add(count)
	done.Add(count)
	for n := 0; n < count; n++ {
		go func(n int) {
			defer done.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			ready.Done()
			<-start
			began := time.Now()
			errs[n] = call(ctx, first+n)
			latencies[n] = float64(time.Since(began).Microseconds()) / 1000.0
		}(n)
	}
	ready.Wait()
	began := time.Now()
	close(start)
	done.Wait()
	wall := time.Since(began).Seconds()
	for _, err := range errs {
		if err != nil {
			return nil, 0, err
		}
	}
	return latencies, wall, nil
}

func main() {
	socket := flag.String("socket", "", "the plugin's unix socket")
	claims := flag.Int("claims", 100, "claims in the measured round")
	warmup := flag.Int("warmup", 10, "claims in the warm-up round")
	namespace := flag.String("namespace", "bench", "the claims' namespace")
	flag.Parse()
	conn, err := grpc.NewClient("unix://"+*socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer conn.Close()
	client := drapb.NewDRAPluginClient(conn)
	prepare := func(ctx context.Context, i int) error {
		reply, err := client.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{
			Claims: []*drapb.Claim{claim(*namespace, i)}})
		if err != nil {
			return err
		}
		for uid, answer := range reply.Claims {
			if answer.Error != "" {
				return fmt.Errorf("prepare %s: %s", uid, answer.Error)
			}
		}
		return nil
	}
	unprepare := func(ctx context.Context, i int) error {
		reply, err := client.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{
			Claims: []*drapb.Claim{claim(*namespace, i)}})
		if err != nil {
			return err
		}
		for uid, answer := range reply.Claims {
			if answer.Error != "" {
				return fmt.Errorf("unprepare %s: %s", uid, answer.Error)
			}
		}
		return nil
	}
	var out result
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if _, _, err := round(*claims, *warmup, prepare); err != nil {
		fail(err)
	}
	if _, _, err := round(*claims, *warmup, unprepare); err != nil {
		fail(err)
	}
	if out.PrepareMs, out.PrepareWallS, err = round(0, *claims, prepare); err != nil {
		fail(err)
	}
	if out.UnprepareMs, out.UnprepareWall, err = round(0, *claims, unprepare); err != nil {
		fail(err)
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fail(err)
	}
}
