#!/bin/sh
dir=$(dirname "$0")
pidfile="$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid"
case "$1" in
-d)
  echo "-d CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES" >> "$dir/mps.calls"
  "$0" __daemon </dev/null >/dev/null 2>&1 &
  exit 0 ;;
__daemon)
  log="$CUDA_MPS_LOG_DIRECTORY/control.log"
  if [ -f "$dir/mps.crash" ]; then
    echo "[stand-in] daemon failed: $(cat "$dir/mps.crash")" >> "$log"
    exit 3
  fi
  echo $$ > "$pidfile"
  # In its own mount namespace, /dev/shm is the claim's shm directory.
  : > "/dev/shm/edra-mps-stand-in.$$"
  echo "[stand-in] control daemon started for $CUDA_VISIBLE_DEVICES" >> "$log"
  while :; do
    if [ -f "$CUDA_MPS_PIPE_DIRECTORY/quit" ] && [ ! -f "$dir/mps.hang" ]; then
      rm -f "$pidfile" "$CUDA_MPS_PIPE_DIRECTORY/quit"
      echo "[stand-in] quit" >> "$log"
      exit 0
    fi
    sleep 0.02
  done ;;
*)
  read -r cmd
  echo "$cmd" >> "$dir/mps.calls"
  pid=$(cat "$pidfile" 2>/dev/null)
  if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null || [ -f "$dir/mps.mute" ]; then
    echo "Cannot find MPS control daemon process" >&2
    exit 1
  fi
  if [ -f "$dir/mps.refuse" ] && case "$cmd" in "$(cat "$dir/mps.refuse")"*) true ;; *) false ;; esac; then
    echo "refused: $cmd" >&2
    exit 1
  fi
  case "$cmd" in quit) touch "$CUDA_MPS_PIPE_DIRECTORY/quit" ;; esac
  exit 0 ;;
esac
