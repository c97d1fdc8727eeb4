"""What is known about the program being migrated, and about torch_npu: what its names and imports refer to
(`names`, `imports`), which guards a rewrite may flip (`guards`), which package a file proves it belongs to
(`packages`), and what torch_npu offers per version (`api`). Rules and analyses ask here; nothing here edits."""
