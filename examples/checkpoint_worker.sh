#!/bin/sh
# A workload that follows gpupool's checkpoint protocol (docs/lending.md, "Checkpoint and resume").
#
# It counts steps (the stand-in for training iterations). On the checkpoint signal (SIGUSR1; SIGTERM
# too) it writes its step into $GPUPOOL_CHECKPOINT_DIR as a new file and exits 0; started again
# with $GPUPOOL_RESUME_FROM naming such a file it continues from that step. Runs in busybox sh.
#
#   CARD=/dev/nvidia0     open this file and keep it open (the GPU the step would use)
#   STEP_SECONDS=1        length of one step
#   IGNORE_CHECKPOINT=1   ignore the signal (a misbehaving workload: the agent kills it)
dir="${GPUPOOL_CHECKPOINT_DIR:-.}"
step=0
if [ -n "$GPUPOOL_RESUME_FROM" ] && [ -r "$GPUPOOL_RESUME_FROM" ]; then
  read -r step < "$GPUPOOL_RESUME_FROM"
  echo "resumed from $GPUPOOL_RESUME_FROM at step $step"
fi
if [ -n "$CARD" ]; then exec 3<"$CARD"; fi
sleeper=""

checkpoint() {
  [ -n "$sleeper" ] && kill "$sleeper" 2>/dev/null
  echo "$step" > "$dir/.ckpt.tmp" && mv "$dir/.ckpt.tmp" "$dir/ckpt-$step"
  echo "checkpoint at step $step in $dir/ckpt-$step"
  exit 0
}

if [ -n "$IGNORE_CHECKPOINT" ]; then trap '' USR1 TERM; else trap checkpoint USR1 TERM; fi
echo "started at step $step"
while :; do
  step=$((step + 1))
  sleep "${STEP_SECONDS:-1}" 3<&- &  # the card stays with the worker, not its timer
  sleeper=$!
  wait "$sleeper"
done
