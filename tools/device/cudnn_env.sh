# Sourced by the device scripts: cuDNN 9's lib directory on LD_LIBRARY_PATH (for
# tierd-train's --attention=auto|cudnn, which opens libcudnn.so.9 at run time), taken from
# the nvidia-cudnn wheel that PyTorch installs, when there is one (the H200 box also has a
# cuDNN 9.14 on its default path, which the trainer finds without this). Says what it found.
cudnn_lib=$(python3 -c 'import os, nvidia.cudnn as c; print(os.path.join(list(c.__path__)[0], "lib"))' 2>/dev/null)
if [ -n "$cudnn_lib" ] && ls "$cudnn_lib"/libcudnn.so.9* > /dev/null 2>&1; then
  export LD_LIBRARY_PATH="$cudnn_lib:${LD_LIBRARY_PATH:-}"
  echo "cuDNN: libcudnn.so.9 from $cudnn_lib (PyTorch's wheel), ahead of any on the system's path"
else
  echo "cuDNN: no nvidia-cudnn wheel for python3 here; a libcudnn.so.9 on the system's path is used if there is one"
fi
