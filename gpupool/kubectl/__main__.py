"""``python -m gpupool.kubectl``: the same command as the installed ``kubectl-gpupool`` script."""

from gpupool.kubectl.main import main

main()
