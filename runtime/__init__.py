"""The process runtime: real ranks on this machine or in a launcher's world.

``launch`` starts local ranks (gloo, NCCL or MPI), supervises them (timeouts, a failed rank ends
the world) and attaches to worlds started by torchrun, srun or mpirun; ``worker`` is one rank's
entry point; ``signals`` makes SIGTERM/SIGHUP end a command as Ctrl-C does and keeps
handlers out of forked children. ``device`` is the one rule for where a run's work goes
(cuda:LOCAL_RANK under nccl, cpu under gloo/mpi) and ``timing`` the one way to time it (CUDA
events on a GPU, the host clock on the CPU). Every layer may use this package; it uses none of
them (only ``records.atomic`` for the files ranks hand back).
"""
