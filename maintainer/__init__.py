"""The maintainers' scripts of the repository, not part of the package, nor a study or a benchmark:

- `doc_tables.py`: writes every generated table of the Markdown files (`python -m maintainer.doc_tables`,
  `--check` to say which are stale; the tests run the check);
- `gpu_wheels.sh`: downloads, here, the wheels a GPU machine without network lacks, into `.whl/`;
- `gpu_run.sh`: on that machine, the scale study's queue (`--part scale`) and the CUDA tests and GPU
  benchmarks (`--part bench`), vLLM's served tokens/s where the machine has vLLM (`--part vllm`);
  `--tiny` runs them on any CPU at tiny sizes (tests/test_gpu_run.py).
"""
