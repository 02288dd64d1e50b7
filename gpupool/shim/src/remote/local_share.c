/*
 * The library a remote-share pod's init container installs when the share turned out local
 * (gpupool/remotegpu/install_client.py): the pod-scheduler webhook sets
 * LD_PRELOAD=/var/run/gpupool-remote/lib/libcuda.so.1 at admission, before the bind decides where
 * the share is, so on the pod's own node's card that path must still hold a loadable object, or the
 * dynamic loader prints "cannot be preloaded" for every program the container starts.
 *
 * It defines no symbol, has no code of its own and needs no other library: the program's libcuda.so.1 stays the node's
 * driver (or the interception library in front of it, which /etc/ld.so.preload loads after this).
 * Its soname is not libcuda.so.1, so the loader never hands it out for a program's
 * DT_NEEDED or dlopen of libcuda.so.1 although the file carries that name in the pod.
 */
typedef int gpupool_local_share_placeholder;
