// gpupool-fakecri serves Kubernetes' fake CRI runtime (k8s.io/cri-client's
// pkg/fake, CRI v1) on a unix socket, so that a real kubelet can run pods on a
// machine without a container engine.
//
// `gpupool testenv build` compiles it in the same wrapper module as the
// Kubernetes release it serves (the same k8s.io/cri-api and cri-client).
//
// The upstream fake is written for unit tests; four fixes make it usable by a
// real kubelet:
//  1. images get a non-zero size (kubelet refuses images of size 0 with
//     "CreateContainerConfigError: Id or size of image ... is not set");
//  2. ImageFsInfo reports a filesystem (kubelet's image GC and eviction
//     manager need one);
//  3. every container gets a real log path under the sandbox's log directory
//     (with an empty path kubelet deletes "<empty>*" in its working directory
//     when it removes a container);
//  4. each container's environment is written to its log in CRI log format,
//     so `kubectl logs` shows what a device plugin's Allocate injected.
//
// Containers run until they are stopped, except one whose command is `true`
// or `false` (as in busybox: `command: ["true"]`): it exits right after it
// started, with status 0 or 1, so init containers finish and Job-like pods
// complete. Its environment is still written to its log first.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	kubeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"
	"k8s.io/cri-client/pkg/util"
)

// fakeImageSize is what every pulled image reports; any non-zero value works.
const fakeImageSize = 1 << 20

// runtime wraps the upstream fake and overrides the calls that need fixes.
type runtime struct {
	*fake.RemoteRuntime
	imageFsDir string

	mu   sync.Mutex
	env  map[string][]*kubeapi.KeyValue // container ID -> env, written to the log at start
	exit map[string]int32               // container ID -> exit code, for containers that exit at once
}

// exitCode says whether a container's command makes it exit right after it
// starts, and with which status: `true` exits 0, `false` exits 1 (a path such
// as /bin/true counts too; arguments are ignored, as those commands do).
func exitCode(config *kubeapi.ContainerConfig) (int32, bool) {
	command := config.GetCommand()
	if len(command) == 0 {
		return 0, false
	}
	switch filepath.Base(command[0]) {
	case "true":
		return 0, true
	case "false":
		return 1, true
	}
	return 0, false
}

// CreateContainer lets the fake create the container, then gives it a real log path.
func (r *runtime) CreateContainer(ctx context.Context, req *kubeapi.CreateContainerRequest) (*kubeapi.CreateContainerResponse, error) {
	resp, err := r.RemoteRuntime.CreateContainer(ctx, req)
	if err != nil {
		return nil, err
	}
	logPath := ""
	if dir := req.GetSandboxConfig().GetLogDirectory(); dir != "" && req.GetConfig().GetLogPath() != "" {
		logPath = filepath.Join(dir, req.GetConfig().GetLogPath())
		if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
			return nil, err
		}
		f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return nil, err
		}
		f.Close()
	}
	svc := r.RemoteRuntime.RuntimeService
	svc.Lock()
	if c, ok := svc.Containers[resp.ContainerId]; ok {
		c.LogPath = logPath
	}
	svc.Unlock()
	r.mu.Lock()
	r.env[resp.ContainerId] = req.GetConfig().GetEnvs()
	if code, ok := exitCode(req.GetConfig()); ok {
		r.exit[resp.ContainerId] = code
	}
	r.mu.Unlock()
	return resp, nil
}

// StartContainer marks the container running and prints its environment to its log.
func (r *runtime) StartContainer(ctx context.Context, req *kubeapi.StartContainerRequest) (*kubeapi.StartContainerResponse, error) {
	resp, err := r.RemoteRuntime.StartContainer(ctx, req)
	if err != nil {
		return nil, err
	}
	svc := r.RemoteRuntime.RuntimeService
	svc.Lock()
	logPath := ""
	if c, ok := svc.Containers[req.ContainerId]; ok {
		logPath = c.LogPath
	}
	svc.Unlock()
	r.mu.Lock()
	envs := r.env[req.ContainerId]
	code, exits := r.exit[req.ContainerId]
	r.mu.Unlock()
	if logPath != "" {
		if err := writeEnvLog(logPath, envs); err != nil {
			fmt.Fprintf(os.Stderr, "gpupool-fakecri: writing log of %s: %v\n", req.ContainerId, err)
		}
	}
	if exits {
		// The process "ran" and finished: kubelet's next relist sees it exited.
		svc.Lock()
		if c, ok := svc.Containers[req.ContainerId]; ok {
			c.State = kubeapi.ContainerState_CONTAINER_EXITED
			c.FinishedAt = time.Now().UnixNano()
			c.ExitCode = code
			c.Reason = "Completed"
			if code != 0 {
				c.Reason = "Error"
			}
		}
		svc.Unlock()
	}
	return resp, nil
}

// RemoveContainer forgets the remembered environment as well.
func (r *runtime) RemoveContainer(ctx context.Context, req *kubeapi.RemoveContainerRequest) (*kubeapi.RemoveContainerResponse, error) {
	r.mu.Lock()
	delete(r.env, req.ContainerId)
	delete(r.exit, req.ContainerId)
	r.mu.Unlock()
	return r.RemoteRuntime.RemoveContainer(ctx, req)
}

// ImageFsInfo reports the runtime's state directory as the image filesystem,
// and as the containers' filesystem too (one disk, as on most nodes).
func (r *runtime) ImageFsInfo(ctx context.Context, req *kubeapi.ImageFsInfoRequest) (*kubeapi.ImageFsInfoResponse, error) {
	usage := func() []*kubeapi.FilesystemUsage {
		return []*kubeapi.FilesystemUsage{{
			Timestamp:  time.Now().UnixNano(),
			FsId:       &kubeapi.FilesystemIdentifier{Mountpoint: r.imageFsDir},
			UsedBytes:  &kubeapi.UInt64Value{Value: fakeImageSize},
			InodesUsed: &kubeapi.UInt64Value{Value: 1},
		}}
	}
	return &kubeapi.ImageFsInfoResponse{ImageFilesystems: usage(), ContainerFilesystems: usage()}, nil
}

// writeEnvLog appends one CRI-format log line ("<time> stdout F KEY=VALUE") per variable.
func writeEnvLog(path string, envs []*kubeapi.KeyValue) error {
	lines := make([]string, 0, len(envs))
	for _, kv := range envs {
		lines = append(lines, kv.GetKey()+"="+string(kv.GetValue()))
	}
	sort.Strings(lines)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	var b strings.Builder
	for _, line := range lines {
		fmt.Fprintf(&b, "%s stdout F %s\n", time.Now().UTC().Format(time.RFC3339Nano), line)
	}
	_, err = f.WriteString(b.String())
	return err
}

// trimCallLog keeps the fake's record of calls from growing without bound;
// kubelet polls the runtime every second and nothing here reads the record.
func trimCallLog(f *fake.RemoteRuntime) {
	for range time.Tick(30 * time.Second) {
		f.RuntimeService.Lock()
		f.RuntimeService.Called = nil
		f.RuntimeService.Unlock()
		f.ImageService.Lock()
		f.ImageService.Called = nil
		f.ImageService.Unlock()
	}
}

func main() {
	endpoint := flag.String("endpoint", "", "unix socket to serve on, e.g. unix:///tmp/x/cri.sock")
	imageFsDir := flag.String("image-fs-dir", "/", "directory reported as the image filesystem")
	flag.Parse()
	if *endpoint == "" {
		fmt.Fprintln(os.Stderr, "gpupool-fakecri: --endpoint is required")
		os.Exit(2)
	}

	f := fake.NewFakeRemoteRuntime()
	f.ImageService.SetFakeImageSize(fakeImageSize)
	f.RuntimeService.FakeStatus = &kubeapi.RuntimeStatus{
		Conditions: []*kubeapi.RuntimeCondition{
			{Type: kubeapi.RuntimeReady, Status: true},
			{Type: kubeapi.NetworkReady, Status: true},
		},
	}
	// kubelet takes its cgroup driver from the runtime (KubeletCgroupDriverFromCRI).
	f.RuntimeService.FakeLinuxConfiguration = &kubeapi.LinuxRuntimeConfiguration{
		CgroupDriver: kubeapi.CgroupDriver_CGROUPFS,
	}
	r := &runtime{RemoteRuntime: f, imageFsDir: *imageFsDir, env: map[string][]*kubeapi.KeyValue{},
		exit: map[string]int32{}}

	server := grpc.NewServer()
	kubeapi.RegisterRuntimeServiceServer(server, r)
	kubeapi.RegisterImageServiceServer(server, r)
	listener, err := util.CreateListener(*endpoint)
	if err != nil {
		fmt.Fprintf(os.Stderr, "gpupool-fakecri: listen on %s: %v\n", *endpoint, err)
		os.Exit(1)
	}
	go trimCallLog(f)

	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-signals
		server.Stop()
	}()
	fmt.Fprintf(os.Stderr, "gpupool-fakecri: serving on %s\n", *endpoint)
	if err := server.Serve(listener); err != nil {
		fmt.Fprintf(os.Stderr, "gpupool-fakecri: %v\n", err)
	}
	if path := strings.TrimPrefix(*endpoint, "unix://"); path != *endpoint {
		os.Remove(path)
	}
}
