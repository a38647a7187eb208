# Sourced by the device scripts: cuDNN 9's lib directory on LD_LIBRARY_PATH (for
# tierd-train's --attention=auto|cudnn, which opens libcudnn.so.9 at run time), taken from
# the nvidia-cudnn wheel that PyTorch installs, when there is one. Says what it found.
cudnn_lib=$(python3 -c 'import os, nvidia.cudnn as c; print(os.path.join(list(c.__path__)[0], "lib"))' 2>/dev/null)
if [ -n "$cudnn_lib" ] && ls "$cudnn_lib"/libcudnn.so.9* > /dev/null 2>&1; then
  export LD_LIBRARY_PATH="$cudnn_lib:${LD_LIBRARY_PATH:-}"
  echo "cuDNN: $(ls "$cudnn_lib"/libcudnn.so.9.* 2>/dev/null | head -n 1 | xargs -r basename) from $cudnn_lib"
else
  echo "cuDNN: no libcudnn.so.9 in a Python nvidia-cudnn package here; our own attention kernels run"
fi
