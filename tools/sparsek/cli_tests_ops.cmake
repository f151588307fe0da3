# CLI tests of the operations side (included by the root CMakeLists inside its CLI-test block, where
# sparsek_cli_test() is defined): `--json` on every subcommand, `bench --compare` (the performance
# gate) on synthetic results, `profile` without ncu and on a recorded ncu CSV, `doctor`, progress,
# threads, and the flag / output mistakes that used to fail late or silently.
set(data ${CMAKE_CURRENT_SOURCE_DIR}/tests/data)
set(bin ${CMAKE_CURRENT_BINARY_DIR})
set(tiny "--backend|cpu|--m|64|--n|16|--k|64|--block|32x32|--reps|1|--warmup|0")

# ---- flag and output mistakes ----
# A GPU variant on a machine (here: a process) without a GPU is an error, not an empty table.
if(SPARSEK_CUDA)
  set(gpu_row_without_gpu "--variants hopper: a GPU row, but no GPU found")
else()
  set(gpu_row_without_gpu "--variants hopper: a GPU row: this sparsek was built without CUDA")
endif()
sparsek_cli_test(bench_gpu_variant_without_gpu 1 "${gpu_row_without_gpu}"
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

# ---- the gate on corrupt or malformed documents: an error naming the file and the field, never
# "not slower" (a -1 ms baseline used to make every row look faster) and never a raw JSON-library
# message. Each case edits one field of a good document (sed, at test time): `which` is the edited
# side (baseline: --compare FILE, results: --from FILE).
function(sparsek_gate_bad name which expr regex)
  set(src ${data}/gate/baseline.json)
  if(which STREQUAL "results")
    set(src ${data}/gate/within.json)
  endif()
  set(f ${bin}/cli_gate_${name}.json)
  if(which STREQUAL "results")
    set(args "bench|--compare|${data}/gate/baseline.json|--from|${f}")
  else()
    set(args "bench|--compare|${f}|--from|${data}/gate/within.json")
  endif()
  sparsek_cli_test(gate_bad_${name} 1 "${regex}" "${args}" "-DPRE=sed -e '${expr}' ${src} > ${f}"
                   "-DNOT_REGEX=PASSED|json\\.exception|not slower")
endfunction()
set(row0 "workloads\\[0\\]\\.variants\\[0\\] \\(8192\\^3 128x128 12\\.50% fixed_k f16 / hopper\\)")
set(bad_ms "a measured row's time must be a positive, finite number of milliseconds")
set(first_ms "0,/\"median_ms\": [0-9.]*/s//\"median_ms\": ")
# Timings that are not a positive, finite number, on either side (the peer row too).
sparsek_gate_bad(base_negative baseline "${first_ms}-1/" "--compare ${bin}/cli_gate_base_negative.json: ${row0}: \"median_ms\" is -1: ${bad_ms}")
sparsek_gate_bad(base_zero baseline "${first_ms}0/" "${row0}: \"median_ms\" is 0: ${bad_ms}")
sparsek_gate_bad(base_null baseline "${first_ms}null/" "${row0}: \"median_ms\" is null: ${bad_ms}")
sparsek_gate_bad(base_string baseline "${first_ms}\"fast\"/" "${row0}: \"median_ms\" is \"fast\": ${bad_ms}")
sparsek_gate_bad(base_peer_negative baseline "s/\"median_ms\": 1.2316/\"median_ms\": -1e-9/"
                 "workloads\\[0\\]\\.variants\\[2\\] \\([^)]*/ cublas_dense_gemm\\): \"median_ms\" is -1e-09: ${bad_ms}")
sparsek_gate_bad(results_zero results "${first_ms}0/" "--from ${bin}/cli_gate_results_zero.json: ${row0}: \"median_ms\" is 0: ${bad_ms}")
sparsek_gate_bad(results_negative results "${first_ms}-0.5/" "--from .*: ${row0}: \"median_ms\" is -0.5: ${bad_ms}")
sparsek_gate_bad(results_null results "${first_ms}null/" "--from .*: ${row0}: \"median_ms\" is null: ${bad_ms}")
# Infinity overflows JSON's numbers and NaN is no JSON: "not JSON", naming the file.
sparsek_gate_bad(base_inf baseline "${first_ms}1e999/" "--compare ${bin}/cli_gate_base_inf.json is not JSON: number overflow parsing '1e999'")
sparsek_gate_bad(results_nan results "${first_ms}NaN/" "--from ${bin}/cli_gate_results_nan.json is not JSON: parse error at line 28, column 19")
# Wrong types and missing fields: the file, the field and what it holds.
sparsek_gate_bad(base_workloads_type baseline "s/\"workloads\": /\"workloads\": 3, \"x\": /"
                 "--compare ${bin}/cli_gate_base_workloads_type.json: \"workloads\" is number, not an array")
sparsek_gate_bad(base_no_workloads baseline "s/\"workloads\"/\"work\"/" "\"workloads\" is missing")
sparsek_gate_bad(base_device_name baseline "s/\"name\": \"Test GPU\"/\"name\": 7/" "device\\.\"name\" is 7 \\(number\\), not a string")
sparsek_gate_bad(base_device_type baseline "s/\"device\": {/\"device\": 1, \"d\": {/" "\"device\" is 1 \\(number\\), not an object")
sparsek_gate_bad(base_status_type baseline "0,/\"status\": \"ok\"/s//\"status\": 1/" "${row0}: \"status\" is 1 \\(number\\), not a string")
sparsek_gate_bad(base_no_label baseline "0,/\"label\"/s//\"labelx\"/" "workloads\\[0\\]\\.\"label\" is missing")
sparsek_gate_bad(base_no_name baseline "0,/\"name\": \"hopper\"/s//\"nam\": \"hopper\"/" "workloads\\[0\\]\\.variants\\[0\\]\\.\"name\" is missing")
sparsek_gate_bad(base_peer_type baseline "0,/\"peer\": false/s//\"peer\": \"no\"/" "${row0}: \"peer\" is \"no\", not true or false")
sparsek_gate_bad(results_variants_type results "0,/\"variants\": /s//\"variants\": {}, \"v\": /"
                 "--from .*: workloads\\[0\\]\\.\"variants\" \\(8192\\^3 128x128 12\\.50% fixed_k f16\\) is object, not an array")
sparsek_gate_bad(results_no_median results "0,/\"median_ms\"/s//\"median\"/" "${row0}: \"median_ms\" is missing from a measured")
sparsek_gate_bad(results_array results "1,$c [1, 2]" "--from .*: the document is array, not a bench --json object")

# ---- input files: regular files only, with a size bound (a FIFO must not hang the gate, a device
# must not be read without end) ----
sparsek_cli_test(gate_dev_zero 1 "cannot read --compare /dev/zero: not a regular file"
                 "bench|--compare|/dev/zero|--from|${data}/gate/within.json")
sparsek_cli_test(gate_from_dev_zero 1 "cannot read --from /dev/zero: not a regular file"
                 "bench|--compare|${data}/gate/baseline.json|--from|/dev/zero")
sparsek_cli_test(gate_fifo 1 "cannot read --compare ${bin}/cli_gate_fifo.json: not a regular file"
                 "bench|--compare|${bin}/cli_gate_fifo.json|--from|${data}/gate/within.json"
                 "-DPRE=rm -f ${bin}/cli_gate_fifo.json && mkfifo ${bin}/cli_gate_fifo.json")
# In a directory, a FIFO, a link to a device and a directory named *.json are skipped (and listed),
# the machine's baseline still found.
set(fifo_dir ${bin}/cli_gate_fifo_dir)
set(make_fifo_dir "rm -rf ${fifo_dir} && mkdir ${fifo_dir} && mkfifo ${fifo_dir}/a.json && ln -s /dev/zero ${fifo_dir}/b.json && mkdir ${fifo_dir}/c.json && cp ${data}/gate/baselines/other-gpu.json ${data}/gate/baselines/test-gpu.json ${fifo_dir}/")
sparsek_cli_test(gate_dir_fifo 0 "against ${fifo_dir}/other-gpu.json .*gate: PASSED"
                 "bench|--compare|${fifo_dir}|--from|${data}/gate/other_gpu.json" "-DPRE=${make_fifo_dir}")
sparsek_cli_test(gate_dir_fifo_listed 1 "no baseline for cpu: .* \\(it holds: a.json \\(skipped: cannot read --compare ${fifo_dir}/a.json: not a regular file[^)]*\\)\\), b.json \\(skipped: [^)]*not a regular file[^)]*\\)\\), c.json \\(skipped: [^)]*: it is a directory\\), other-gpu.json \\(Other GPU\\)"
                 "bench|${tiny}|--compare|${fifo_dir}" "-DPRE=${make_fifo_dir}")
sparsek_cli_test(gate_huge 1 "cannot read --compare ${bin}/cli_gate_huge.json: larger than 256 MiB"
                 "bench|--compare|${bin}/cli_gate_huge.json|--from|${data}/gate/within.json"
                 "-DPRE=rm -f ${bin}/cli_gate_huge.json && truncate -s 300M ${bin}/cli_gate_huge.json")
set_tests_properties(cli_gate_dev_zero cli_gate_from_dev_zero cli_gate_fifo cli_gate_dir_fifo cli_gate_dir_fifo_listed
                     cli_gate_huge PROPERTIES TIMEOUT 30)
set_tests_properties(cli_gate_dir_fifo_listed PROPERTIES RUN_SERIAL ON)  # shares the directory with cli_gate_dir_fifo
sparsek_cli_test(gate_threshold_needs_compare 2 "--threshold 3: only goes with --compare BASELINE" "bench|--threshold|3")

# ---- text printed from files is made printable: escape sequences, bells, carriage returns and C1
# controls in a tuning cache or a baseline are shown as \xNN, never sent to the terminal raw ----
string(ASCII 27 esc)
string(ASCII 7 bel)
sparsek_cli_test(cache_show_escapes 0
                 "cpu: \\\\x1b.2Jevil\\\\x07 .*-> \\\\x1b.0.title\\\\x07cpu 0.0665 ms \\(default x\\\\xc2\\\\x9by .*tuned \\\\x1b.31mred\\\\x1b.0m café.*candidates \\(ms\\): a\\\\rb\\\\x1b.K 0.5000"
                 "cache|show" "-DNOT_REGEX=${esc}|${bel}")
sparsek_cli_test(cache_show_escapes_json 0 "\"variant\": \"\\\\u001b.0.title\\\\u0007cpu\"" "cache|show|--json|-"
                 "-DNOT_REGEX=${esc}|${bel}")
set_tests_properties(cli_cache_show_escapes cli_cache_show_escapes_json PROPERTIES
                     ENVIRONMENT "SPARSEK_CACHE=${data}/cache/escapes.json;SPARSEK_TUNE=")
sparsek_cli_test(gate_escapes 0 "Test GPU, sparsek 0.1.0, \\\\x1bc\\\\x07\\).*gate: PASSED"
                 "bench|--compare|${bin}/cli_gate_escapes.json|--from|${data}/gate/within.json"
                 "-DPRE=sed -e 's/\"date\": \"2026-01-01T00:00:00Z\"/\"date\": \"\\\\u001bc\\\\u0007\"/' ${data}/gate/baseline.json > ${bin}/cli_gate_escapes.json"
                 "-DNOT_REGEX=${esc}|${bel}")

# ---- mistakes found before any work: an unwritable --json on every subcommand that takes it (exit
# 1 naming the path; nothing ran), profile's workload flags checked in the parent (exit 2 naming the
# flag, before it looks for ncu: the missing ncu below would otherwise answer first) ----
set(nowhere ${bin}/no-such-dir)
foreach(case
    "verify|verify|--backend|cpu|--cases|3|failure"
    "tune|tune|--backend|cpu|--no-store|--m|128|--block|32x32|--budget|0.02|winner"
    "tune_plan_time|tune|--backend|cpu|--plan-time|--m|128|--block|32x32|plan\\(\\) time"
    "doctor|doctor|driver"
    "cache_show|cache|show|tuning cache "
    "cache_clear|cache|clear|removed"
    "bench_attention|bench|--op|attention|--backend|cpu|--heads|4|--seq|128|--dim|64|--block|64|--reps|1|median"
    "bench_gate_op|bench|--op|gate|--backend|cpu|--seq|1024|--block|64|--reps|1|median"
    "profile|profile|--from-csv|${data}/ncu_details.csv|duration_us")
  string(REPLACE "|" ";" parts "${case}")
  list(GET parts 0 name)
  list(GET parts -1 work)
  list(REMOVE_AT parts 0 -1)
  string(REPLACE ";" "|" cmd "${parts}")
  sparsek_cli_test(json_unwritable_${name} 1 "I/O error: cannot write --json ${nowhere}/x.json: No such file or directory"
                   "${cmd}|--json|${nowhere}/x.json" "-DNOT_REGEX=${work}")
  set_tests_properties(cli_json_unwritable_${name} PROPERTIES ENVIRONMENT "SPARSEK_CACHE=${bin}/cli_json_unwritable_cache.json")
endforeach()
sparsek_cli_test(profile_out_unwritable 1 "cannot write --out ${nowhere}/p.txt: No such file or directory"
                 "profile|--from-csv|${data}/ncu_details.csv|--out|${nowhere}/p.txt" "-DNOT_REGEX=duration_us")
sparsek_cli_test(profile_raw_unwritable 1 "cannot write --raw ${nowhere}/p.csv: No such file or directory"
                 "profile|--from-csv|${data}/ncu_details.csv|--raw|${nowhere}/p.csv" "-DNOT_REGEX=duration_us")
sparsek_cli_test(profile_from_csv_fifo 1 "cannot read --from-csv ${bin}/cli_profile_fifo.csv: not a regular file"
                 "profile|--from-csv|${bin}/cli_profile_fifo.csv"
                 "-DPRE=rm -f ${bin}/cli_profile_fifo.csv && mkfifo ${bin}/cli_profile_fifo.csv")
set_tests_properties(cli_profile_from_csv_fifo PROPERTIES TIMEOUT 30)
set(no_ncu "--ncu|${bin}/no-such-ncu")
sparsek_cli_test(profile_bad_m 2 "--m 0: must be in \\[1, 1048576\\]" "profile|${no_ncu}|--m|0" "-DNOT_REGEX=ncu")
sparsek_cli_test(profile_bad_n 2 "--n x: " "profile|${no_ncu}|--n|x" "-DNOT_REGEX=ncu")
sparsek_cli_test(profile_bad_block 2 "--block 7x7: " "profile|${no_ncu}|--block|7x7" "-DNOT_REGEX=ncu")
sparsek_cli_test(profile_bad_density 2 "--density 2: must be in \\(0, 1\\]" "profile|${no_ncu}|--density|2" "-DNOT_REGEX=ncu")
sparsek_cli_test(profile_bad_pattern 2 "--pattern zig: must be one of" "profile|${no_ncu}|--pattern|zig" "-DNOT_REGEX=ncu")
sparsek_cli_test(profile_bad_dtype 2 "--dtype f8: must be one of" "profile|${no_ncu}|--dtype|f8" "-DNOT_REGEX=ncu")
sparsek_cli_test(profile_bad_seed 2 "--seed -1: " "profile|${no_ncu}|--seed|-1" "-DNOT_REGEX=ncu")
sparsek_cli_test(profile_bad_warmup 2 "--warmup -1: must be in \\[0, 1000\\]" "profile|${no_ncu}|--warmup|-1" "-DNOT_REGEX=ncu")
sparsek_cli_test(profile_m_not_blocks 2 "--m 100: must be a multiple of the block's rows \\(128\\)" "profile|${no_ncu}|--m|100" "-DNOT_REGEX=ncu")
sparsek_cli_test(profile_k_not_blocks 2 "--k 96: must be a multiple of the block's columns \\(64\\)"
                 "profile|${no_ncu}|--block|64x64|--k|96" "-DNOT_REGEX=ncu")
sparsek_cli_test(profile_bad_variant 2 "--variant nope: unknown variant \\(GPU variants: .*hopper" "profile|${no_ncu}|--variant|nope" "-DNOT_REGEX=ncu")
sparsek_cli_test(profile_cpu_variant 2 "--variant cpu: not a sparsek GPU variant" "profile|${no_ncu}|--variant|cpu" "-DNOT_REGEX=ncu")

# ---- another process holds the tuning cache's lock (flock(1) holds it while sparsek runs): tune
# and cache clear wait at most --lock-wait seconds (--no-wait: not at all), then exit 1 naming the
# holder ----
find_program(SPARSEK_FLOCK flock)
if(SPARSEK_FLOCK)
  set(lock_cache ${bin}/cli_lock_cache.json)
  function(sparsek_cli_locked_test name rc regex args)
    add_test(NAME cli_${name} COMMAND ${CMAKE_COMMAND} -DCLI=${SPARSEK_FLOCK}
             "-DARGS=-o|${lock_cache}.lock|$<TARGET_FILE:sparsek_cli>|${args}" -DEXPECT_RC=${rc} "-DREGEX=${regex}"
             ${ARGN} -P ${cli_driver})
    set_tests_properties(cli_${name} PROPERTIES LABELS cpu TIMEOUT 60 RESOURCE_LOCK cli_lock_cache
                         ENVIRONMENT "SPARSEK_CACHE=${lock_cache}")
  endfunction()
  set(held "cannot lock the tuning cache: ${lock_cache}.lock: it is held by process [0-9]+")
  sparsek_cli_locked_test(cache_clear_locked_no_wait 1 "${held} \\(waited 0.0 s\\)" "cache|clear|--no-wait"
                          -DNOT_REGEX=removed)
  sparsek_cli_locked_test(cache_clear_locked_wait 1 "${held} \\(waited 1.[0-9] s\\)" "cache|clear|--lock-wait|1"
                          -DNOT_REGEX=removed)
  sparsek_cli_locked_test(tune_locked_no_wait 1 "winner: cpu.*NOT stored: ${held} \\(waited 0.0 s\\)"
                          "tune|--backend|cpu|--m|128|--block|32x32|--budget|0.02|--no-wait" "-DNOT_REGEX=stored in")
  sparsek_cli_locked_test(tune_locked_wait 1 "NOT stored: ${held} \\(waited 1.[0-9] s\\)"
                          "tune|--backend|cpu|--m|128|--block|32x32|--budget|0.02|--lock-wait|1")
endif()
sparsek_cli_test(cache_show_no_wait 2 "--no-wait *: only goes with clear" "cache|show|--no-wait")
sparsek_cli_test(cache_clear_bad_wait 2 "--lock-wait -1: must be a number of seconds in \\[0, 86400\\]" "cache|clear|--lock-wait|-1")
sparsek_cli_test(cache_clear_nan_wait 2 "--lock-wait nan: must be a number of seconds" "cache|clear|--lock-wait|nan")
sparsek_cli_test(cache_clear_both_waits 2 "--no-wait *: choose --no-wait or --lock-wait, not both" "cache|clear|--no-wait|--lock-wait|3")
sparsek_cli_test(tune_no_store_no_wait 2 "--no-wait *: not with --no-store" "tune|--backend|cpu|--no-store|--no-wait")
set_tests_properties(cli_cache_clear_bad_wait cli_cache_clear_nan_wait cli_cache_clear_both_waits PROPERTIES
                     ENVIRONMENT "SPARSEK_CACHE=${bin}/cli_lock_cache.json")
