"""`python -m qualify serve-check` (and `scripts/verify.sh --matrix`): the serving correctness matrix (issue 39).

Run against a deployed OpenAI-compatible vLLM server, found as scripts/verify.sh finds it (the settings file and
the deployment start.sh recorded) or given by `--url URL --model NAME`. The matrix's prompts, tolerances and
thresholds are data (qualify/probe/rules/serve-matrix-v1.json, read by probe/servematrix.py); the record it
writes is release/serving.py's. One module per job:

  server      which server, image, release, container and settings the run is about
  client      the HTTP requests (chat, completions, tokenize, streams), bounded and with timeouts
  result      one check's outcome: status, reason, measured numbers
  basic       serve.determinism, serve.niah, serve.tools
  soak        serve.soak, and the server's memory (the container's, or the listening process tree's)
  providers   serve.providers: the server's start-up log against the release manifest's prediction
  accuracy    serve.accuracy against a BF16 reference (reference.py computes one with transformers, in a
              child interpreter with a timeout)
  run         the order of the checks, the record, its signature, the table, the exit code
"""
