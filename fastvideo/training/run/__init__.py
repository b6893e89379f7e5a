"""The run around the training loop: its output folder and lock (output_dir), what makes it the run
it is and the resume check (identity), flags changed on resume (resume_changes), stop requests and
the launcher's control folder (control), the reward-hacking guard's best checkpoint (guard), and the
start-up steps in order (start). Nothing here imports the loop (fastvideo.training's modules)."""
