"""`python -m qualify serve-check`: the serving correctness matrix against a running server, as a signed record.

Found as scripts/verify.sh finds it (`--env-file`, default .env, and what ./start.sh recorded), or `--url URL
--model NAME`. Exit 0 when no check failed (a check that could not run is `not-run` with its reason), 1 when
one did (`scripts/verify.sh --matrix`, which hands over here, exits 6 then, as verify.sh does).
"""

from __future__ import annotations

from pathlib import Path

from qualify.deploy import settings


def configure_parser(parser) -> None:
    parser.add_argument("--env-file", type=Path, default=settings.REPO / ".env",
                        help="the deploy's settings file (default .env): the server start.sh deployed")
    parser.add_argument("--url", default="", help="a server's base URL instead (http://127.0.0.1:8000); with --model")
    parser.add_argument("--model", default="", help="with --url: the served model name")
    parser.add_argument("--image", default=None, help="with --url: the image it serves, repository@sha256:<digest>")
    parser.add_argument("--target", default="", help="with --url: the target (images/targets.toml) it serves")
    parser.add_argument("--release-dir", type=Path, default=None,
                        help="with --url: the release folder (manifests/TAG) whose manifest predicts its providers")
    parser.add_argument("--tool-call-parser", default=None,
                        help="with --url: the server's --tool-call-parser ('' for none; default: not known)")
    parser.add_argument("--max-model-len", type=int, default=0,
                        help="with --url: the server's context when /v1/models does not say")
    parser.add_argument("--container", default="",
                        help="with --url: the server's container on this host (its start-up log and its memory)")
    parser.add_argument("--server-log", type=Path, default=None,
                        help="the server's start-up log (default: the deployment's container log)")
    parser.add_argument("--out", type=Path, default=None,
                        help="the record to write (default: beside the release's manifest, manifests/TAG/)")
    parser.add_argument("--sign-key", type=Path, default=None,
                        help="this host's cosign key (default: EVIDENCE_SIGNING_KEY): OUT.sig and OUT.sigstore.json "
                        "beside the record, so that `promote` counts it once the host is enrolled")
    parser.add_argument("--reference", type=Path, default=None,
                        help="serve.accuracy's BF16 reference: a file --record-reference wrote")
    parser.add_argument("--reference-model", type=Path, default=None,
                        help="compute the BF16 reference from this model folder with transformers (default: the "
                        "deployment's MODEL_PATH)")
    parser.add_argument("--reference-python", default="",
                        help="the Python with torch and transformers that computes it (default: this one)")
    parser.add_argument("--record-reference", type=Path, default=None,
                        help="write this server's answers (with --reference-model: transformers') as a reference "
                        "to FILE, and run no check: run it against the BF16 deployment of the model")
    parser.add_argument("--matrix", default=None, help="another matrix data file (default: the probe's serve-matrix-v1)")
    parser.add_argument("--prog", default="serve-check", help="the name messages carry (the script that handed over)")


def execute(args) -> int:
    from qualify.deploy.servecheck import run, server
    from qualify.deploy.ui import EX_CHECK, Ui

    ui = Ui(args.prog)
    if args.url:
        if not args.model:
            ui.say("ERROR: --url needs --model (the served model name)")
            return 2

        def find():
            return server.from_url(args.url, args.model, args.image, args.target, args.release_dir,
                                   args.tool_call_parser, args.server_log, args.max_model_len, args.reference_model,
                                   args.container)
    else:
        def find():
            return server.from_settings(args.env_file, ui, args.server_log)
    opts = run.Options(out=args.out, sign_key=args.sign_key, reference=args.reference,
                       reference_model=args.reference_model, reference_python=args.reference_python,
                       record_reference=args.record_reference, matrix_file=args.matrix)
    return run.main(find, opts, ui, failure_code=EX_CHECK if args.prog == "verify" else 1)
