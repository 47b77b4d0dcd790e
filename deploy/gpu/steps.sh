# steps.sh: what the GPU check scripts share, sourced by them: step (a
# titled, timed section), want (the section is in $STEPS), fail (0 until a
# step fails), and ncu and nvcc on PATH where CUDA installed them.
fail=0
step() { printf '\n=== %s  [%s]\n' "$*" "$(date -u +%T)"; }
want() { [[ " $STEPS " == *" $1 "* ]]; }
command -v ncu >/dev/null || for d in /usr/local/cuda/bin /usr/local/cuda-*/bin /opt/nvidia/nsight-compute/*; do
  [ -x "$d/ncu" ] && export PATH=$PATH:$d && break; done
command -v nvcc >/dev/null || for d in /usr/local/cuda/bin /usr/local/cuda-*/bin; do
  [ -x "$d/nvcc" ] && export PATH=$PATH:$d && break; done
