/* An empty library with the CUDA driver's soname, linked so that libtorch_tp_jit.so records
   NEEDED libcuda.so.1 without a driver on the build machine. The real libcuda.so.1 is
   resolved by the dynamic loader on the user's machine; this stub is never shipped. */
int fastmace_cuda_driver_stub;
