"""``python -m control.frontend``: run the front end in front of a Triton server (loopback by default)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from control.frontend.limits import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_JSON_DEPTH, BodyLimits


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer >= 1") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{v} must be >= 1")
    return v


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m control.frontend",
                                description="OpenAI-compatible API and a guarded KServe proxy in front of Triton")
    p.add_argument("--triton-grpc", required=True, help="Triton gRPC address HOST:PORT")
    p.add_argument("--triton-http", required=True, help="Triton HTTP URL http://HOST:PORT (kept on loopback)")
    p.add_argument("--tokenizer-dir", type=Path, help="directory with tokenizer.json (usage counts, chat template)")
    p.add_argument("--model", default="llm", help="Triton model name, also the served OpenAI model id (default llm)")
    p.add_argument("--max-k", type=_positive, default=8, help="the deployment's largest draft length (default 8)")
    p.add_argument("--spec-decode-metrics", action="store_true",
                   help="add metrics.speculative_decoding to every response (else only when a request asks)")
    p.add_argument("--chat-max-tokens", type=_positive, default=256, help="chat max_tokens when not given")
    p.add_argument("--max-body-bytes", type=_positive, default=DEFAULT_MAX_BODY_BYTES)
    p.add_argument("--max-json-depth", type=_positive, default=DEFAULT_MAX_JSON_DEPTH)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    return p


def main(argv: list[str] | None = None) -> int:
    from control.errors import SpecctlError
    from control.frontend.app import FrontendConfig, create_app
    from control.service.server import bind, serve

    a = parser().parse_args(argv)
    cfg = FrontendConfig(triton_grpc=a.triton_grpc, triton_http=a.triton_http, tokenizer_dir=a.tokenizer_dir,
                         model=a.model, max_k=a.max_k, spec_metrics=a.spec_decode_metrics,
                         chat_max_tokens=a.chat_max_tokens, limits=BodyLimits(a.max_body_bytes, a.max_json_depth))
    try:
        sock = bind(a.host, a.port)
    except SpecctlError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    serve(create_app(cfg), sock)
    return 0


if __name__ == "__main__":
    sys.exit(main())
