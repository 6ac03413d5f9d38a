#!/bin/sh
dir=$(dirname "$0")
echo "$*" >> "$dir/nvidia-smi.calls"
if [ -f "$dir/nvidia-smi.fail" ]; then
  match=$(head -n 1 "$dir/nvidia-smi.fail")
  case "$match" in
    '*') fail=1 ;;
    *) case "$*" in *"$match"*) fail=1 ;; *) fail=0 ;; esac ;;
  esac
  if [ "$fail" = 1 ]; then
    tail -n +2 "$dir/nvidia-smi.fail" >&2
    exit 4
  fi
fi
exit 0
