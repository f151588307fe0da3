# CLI tests of the operations side (included by the root CMakeLists inside its CLI-test block, where
# sparsek_cli_test() is defined): `--json` on every subcommand, `bench --compare` (the performance
# gate) on synthetic results, `profile` without ncu and on a recorded ncu CSV, `doctor`, progress,
# threads, and the flag / output mistakes that used to fail late or silently.
set(data ${CMAKE_CURRENT_SOURCE_DIR}/tests/data)
set(bin ${CMAKE_CURRENT_BINARY_DIR})
set(tiny "--backend|cpu|--m|64|--n|16|--k|64|--block|32x32|--reps|1|--warmup|0")

# ---- flag and output mistakes ----
# A GPU variant on a machine (here: a process) without a GPU is an error, not an empty table.
sparsek_cli_test(bench_gpu_variant_without_gpu 1 "--variants hopper: a GPU row, but no GPU found"
                 "bench|--variants|hopper|--m|64|--n|16|--k|64|--block|32x32")
sparsek_cli_test(bench_gpu_variant_on_cpu 2 "--variants hopper: 'hopper' is a GPU row, but --backend cpu"
                 "bench|--backend|cpu|--variants|hopper")
# An unwritable --json fails before any work, with the reason.
sparsek_cli_test(bench_json_unwritable 1 "I/O error: cannot write --json ${bin}/no-such-dir/x.json: No such file or directory"
                 "bench|${tiny}|--json|${bin}/no-such-dir/x.json" -DNOT_REGEX=effective)
sparsek_cli_test(bench_huge_dims 1 "the workload --m 1048576 --n 1048576 --k 1048576 needs [0-9.]+ GiB of host memory; this machine has [0-9.]+ GiB"
                 "bench|--backend|cpu|--m|1048576|--n|1048576|--k|1048576")
sparsek_cli_test(tune_huge_dims 1 "needs [0-9.]+ GiB of host memory"
                 "tune|--backend|cpu|--m|1048576|--no-store")
# Seeds are decimal (010 is ten, 09 is nine); --json - is stdout, not a file named "-".
sparsek_cli_test(seed_decimal 0 "\"seed\": 10[,\n]" "bench|${tiny}|--seed|010|--json|-" -DABSENT=${bin}/-)
sparsek_cli_test(seed_leading_zero 0 "\"seed\": 9[,\n]" "bench|${tiny}|--seed|09|--json|-")
sparsek_cli_test(seed_not_decimal 2 "--seed 0x10: not an unsigned decimal integer" "bench|--seed|0x10")
sparsek_cli_test(bench_threads 0 "CPU backend[^\n]*, 2 thread\\(s\\).*eff GFLOPS" "bench|${tiny}|--threads|2")
sparsek_cli_test(bench_omp_threads 0 "CPU backend[^\n]*, 3 thread\\(s\\)" "bench|${tiny}")
set_tests_properties(cli_bench_gpu_variant_without_gpu PROPERTIES ENVIRONMENT "CUDA_VISIBLE_DEVICES=")
set_tests_properties(cli_bench_omp_threads PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=3")

# ---- --json on every subcommand that prints results ----
# The gate's document is bench's (mode, device, settings, its rows), its figures also at the top.
sparsek_cli_test(bench_gate_json 0 "wrote .*cli_bench_gate_doc.json"
                 "bench|--op|gate|--backend|cpu|--seq|1024|--block|64|--reps|1|--warmup|0|--json|${bin}/cli_bench_gate_doc.json"
                 -DJSON=${bin}/cli_bench_gate_doc.json)
sparsek_cli_test(verify_json 0 "\"cases_per_variant\": \\{\n +\"cpu\": 12\n.*\"passed\": true"
                 "verify|--backend|cpu|--cases|12|--json|-")
# (The JSON is stdout, which the driver prints before stderr.)
sparsek_cli_test(tune_json 0 "\"winner\": \"cpu\".*eff GFLOPS"
                 "tune|--backend|cpu|--no-store|--m|128|--block|32x32|--budget|0.02|--json|-")
sparsek_cli_test(doctor_json 0 "\"name\": \"cpu\",\n +\"backend\": \"cpu\",\n +\"peer\": false,\n +\"runs_here\": true.*can run here: cpu"
                 "doctor|--json|-")
sparsek_cli_test(cache_show_json 0 "\"state\": \"missing\",\n +\"tune_mode\": \"cached\",\n +\"entries\": \\[\\]"
                 "cache|show|--json|-")
set_tests_properties(cli_cache_show_json PROPERTIES ENVIRONMENT "SPARSEK_CACHE=${bin}/cli-no-such-cache.json;SPARSEK_TUNE=")
# A progress line (forced on: ctest's stdout is no terminal) with percent and ETA.
sparsek_cli_test(verify_progress 0 "\\[#*\\.*\\] +[0-9]+%  [0-9]+/20  ETA [-0-9]+:[-0-9]+  failures 0"
                 "verify|--backend|cpu|--cases|20")
set_tests_properties(cli_verify_progress PROPERTIES ENVIRONMENT "SPARSEK_PROGRESS=1")

# ---- the performance gate (bench --compare), on synthetic results: no timing involved ----
sparsek_cli_test(gate_pass 0 "gate: PASSED: 4 row\\(s\\) compared"
                 "bench|--compare|${data}/gate/baseline.json|--from|${data}/gate/within.json")
sparsek_cli_test(gate_slower 1
                 "8192\\^3 64x64 12.50% fixed_k f16 / hopper: 0.3401 ms -> 0.3605 ms \\(x1.060, \\+6.0%\\)"
                 "bench|--compare|${data}/gate/baseline.json|--from|${data}/gate/slower.json")
sparsek_cli_test(gate_threshold 0 "gate: PASSED"
                 "bench|--compare|${data}/gate/baseline.json|--from|${data}/gate/slower.json|--threshold|7")
sparsek_cli_test(gate_missing_row 1 "portable: 0.5287 ms in the baseline, now failed: cudaErrorIllegalAddress"
                 "bench|--compare|${data}/gate/baseline.json|--from|${data}/gate/missing.json")
sparsek_cli_test(gate_other_gpu 1 "was recorded on Test GPU, these results on Other GPU"
                 "bench|--compare|${data}/gate/baseline.json|--from|${data}/gate/other_gpu.json")
sparsek_cli_test(gate_directory 0 "against ${data}/gate/baselines/other-gpu.json \\(Other GPU.*gate: PASSED"
                 "bench|--compare|${data}/gate/baselines|--from|${data}/gate/other_gpu.json")
sparsek_cli_test(gate_no_baseline 1 "no baseline for cpu: .* in ${data}/gate/baselines \\(it holds: other-gpu.json \\(Other GPU\\), test-gpu.json \\(Test GPU\\)\\)"
                 "bench|${tiny}|--compare|${data}/gate/baselines")
sparsek_cli_test(gate_from_needs_compare 2 "--from .*only goes with --compare" "bench|--from|x.json")
# A real CPU run against the file bench_cpu_json recorded (a threshold no timing noise reaches).
sparsek_cli_test(gate_cpu_run 0 "gate: PASSED: 1 row\\(s\\) compared"
                 "bench|--backend|cpu|--m|128|--n|96|--k|256|--block|64x32|--pattern|power_law|--density|0.3|--reps|2|--compare|${bin}/cli_bench_cpu.json|--threshold|1000")
set_tests_properties(cli_bench_cpu_json PROPERTIES FIXTURES_SETUP bench_cpu_recorded)
set_tests_properties(cli_gate_cpu_run PROPERTIES FIXTURES_REQUIRED bench_cpu_recorded)

# ---- profile ----
sparsek_cli_test(profile_help 0 "Usage: sparsek profile.*--out FILE" "profile|--help")
sparsek_cli_test(profile_no_ncu 1 "ncu \\(Nsight Compute\\) not found \\(looked at: ${bin}/no-such-ncu\\). Install it"
                 "profile|--ncu|${bin}/no-such-ncu")
sparsek_cli_test(profile_from_csv 0
                 "# kernel 1 of 1: void sparsek::hopper_kernel.*\nduration_us +227.3\nsm_clock_mhz +1510\n.*tensor_pipe_wgmma_active_pct +70.12\n.*dram_read_mb +403.2\n.*stall_barrier +1.532"
                 "profile|--from-csv|${data}/ncu_details.csv")
