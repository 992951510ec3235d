"""The lab: measuring, tuning, profiling and checking the Numba CUDA kernels of `kernels`.

Everything runs as ``python -m benchmarks <command> [options]`` from the repository root
(``python -m benchmarks`` lists the commands, ``python -m benchmarks <command> --help`` their
options); each command is one module with a ``main(argv)``:

* ``bench`` (`benchmarks.bench`): our kernels against PyTorch SDPA's backends in one run, a
  results file with provenance, and its summary table (``--summary``, ``--readme``);
* ``measure`` (`benchmarks.measure`): the measured sweep the cost model is compared with;
  ``run_sweep`` is what the dashboard's *Measure* page calls;
* ``ncu`` (`benchmarks.ncu`): Nsight Compute counters for a results file's records, and the
  split of their global loads (``--loads``);
* ``tune`` (`benchmarks.tune`): block sizes of one family (``--family``) or launch orders
  (``--orders``), timed against SDPA;
* ``resources`` (`benchmarks.resources`): registers and spills per kernel configuration from
  ``ptxas`` (CPU), the table `sim.resources` reads;
* ``check`` (`benchmarks.check`): PTX / ptxas / SASS checks of the tensor-core kernels (CPU);
* ``sanitize`` (`benchmarks.sanitize`): one small case per family for ``compute-sanitizer``;
* ``host-cost`` (`benchmarks.host_cost`): the host time of one kernel call;
* ``ring`` (`benchmarks.ring`): ring attention (`ioaware.distributed`) on several GPUs against
  one GPU and PyTorch's context parallelism, and the GPU-to-GPU link (``--p2p``); launched with
  ``torchrun --nproc-per-node 2 -m benchmarks ring``;
* ``decode`` (`benchmarks.decode`): decoding with a KV cache (the split-KV forward) against
  SDPA's backends, with the model's prediction and Nsight Compute DRAM bytes, and
  sliding-window attention;
* ``first-call`` (`benchmarks.first_call`): the first call of a configuration in a fresh
  process, compiling (empty kernel cache) and loading (`kernels.compile_cache`);
* ``train-step`` (`benchmarks.train_step`): a training step of a small Hugging Face Llama
  (grouped-query attention) with our attention against SDPA's.
* ``rates`` (`benchmarks.rates`): the GPU's achievable rates (DRAM, L2, shared memory,
  ``mma.sync``, FFMA, ex2, ``cp.async``, launch) by microbenchmarks, the file a profile takes
  with ``sim.load_profile(name, rates=FILE)``.
* ``pick`` (`benchmarks.pick`): every legal tile configuration timed against the model's pick.
* ``fp8`` (`benchmarks.fp8`): the FP8 forward (`ioaware.fp8`) against our float16 forward and
  SDPA's FLASH and cuDNN in one run, and its error on FlashAttention-3's outlier inputs.
* ``replace`` (`benchmarks.replace`): re-measured records put into a shipped results file in
  place of those of the same configuration, noted in its provenance (CPU).

`benchmarks.common` holds what several commands share (timing by CUDA events, provenance,
compiling for sm_90). ``bash benchmarks/gpu_job.sh MODE ...`` runs the usual sets on a GPU
machine. The kernels are configured through `kernels.KernelConfig` only; nothing here sets
environment variables that select kernels (``python -m benchmarks`` sets
``NUMBA_ENABLE_CUDASIM=0`` for the compile-only commands, which cannot run in the simulator).
"""
