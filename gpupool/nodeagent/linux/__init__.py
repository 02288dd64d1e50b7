"""The node agent's Linux kernel interfaces: /proc, cgroup v2, fanotify, bpf(2) and the
cgroup-device gate, statfs, and a file's identity whatever path reached it (device number, inode).

Each module wraps one kernel interface (system calls through ctypes, files under /proc and /sys)
and knows nothing of pods, containers or GPU usage, so the monitor, the container layer, the
lending rules and the risk checks build on them alike. The import contracts keep it that way.
"""
