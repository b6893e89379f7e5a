"""Cross-device alignment: record runs, probe layers, compare two runs (docs/alignment.md).

- recorder.RunRecorder      what a run did, per iteration, named by global sample id
- probes.record_probes      every chosen module's output for one fixed input
- compare.compare_runs      rewards / images / loss / probes of two runs -> checks and a verdict
- report.write_report       report.md, summary.json and plots
Randomness capture/replay lives in fastvideo.sampling.randomness (--dump_randomness / --load_randomness).
"""
