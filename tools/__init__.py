"""Repository tools: the generated README tables (`doc_tables`) and the GPU machine's scripts
(`gpu_run.sh`, `gpu_wheels.sh`). Not part of the package, nor a study or a benchmark."""
