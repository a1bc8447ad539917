"""The router's flags: one frozen dataclass, one flag per field (shared/cli_args.py).

Flag names follow vLLM's OpenAI server where the concept is the same
(`--host`, `--port`, `--api-key`, `--served-model-name`, `--chat-template`,
`--tokenizer`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shared import env
from shared.errors import ConfigError
from shared.registry import DEFAULT_PREFIX

ROUTING_POLICIES = ("affinity", "load")
TOOL_CALL_PARSERS = ("hermes", "llama3_json", "mistral")  # router/tools/parsers.py
REASONING_PARSERS = ("qwen3", "deepseek_r1")  # router/text/reasoning.py
DEFAULT_HTTP_PORT = 8000
DEFAULT_GRPC_PORT = 50050
# How long a routing choice counts as "this worker holds the prefix". With Redis
# it only bridges the moment until the worker's own ownership records arrive;
# without Redis the choices are all the router knows, so they last longer.
CHOICE_TTL_WITH_REDIS_S = 10.0
CHOICE_TTL_LOCAL_S = 300.0
DEFAULT_MAX_BODY_BYTES = 32 * 2**20
DEFAULT_MAX_TOKENS_PER_REQUEST = 131072
DEFAULT_TIMEOUT_KEEP_ALIVE_S = 75.0  # nginx's default, above an AWS ALB's 60 s idle timeout
DEFAULT_MAX_CHAT_MESSAGES = 2048  # OpenAI's bound on a chat's messages


def _port(name: str, value: int) -> None:
    if not 0 <= value <= 65535:
        raise ConfigError(f"--{name} must be in [0, 65535] (0: any free port), got {value}")


def _positive(name: str, value: float | None) -> None:
    if value is not None and value <= 0:
        raise ConfigError(f"--{name.replace('_', '-')} must be > 0, got {value}")


@dataclass(frozen=True)
class RouterConfig:
    host: str = field(default="0.0.0.0", metadata={"help": "Interface to listen on."})
    port: int = field(default=DEFAULT_HTTP_PORT, metadata={"help": "OpenAI-compatible HTTP port."})
    grpc_port: int = field(
        default=DEFAULT_GRPC_PORT,
        metadata={"help": "gRPC port of the pagoda.v1 text API (0: any free port)."},
    )
    worker: tuple[str, ...] = field(
        default=(),
        metadata={"help": "A worker's host:port, for a static list (repeatable)."},
    )
    redis_url: str | None = field(
        default_factory=env.redis_url,
        metadata={
            "help": "Redis with the worker registry, e.g. redis://host:6379/0 "
            "(default: $REDIS_URL; none: an in-process store)."
        },
    )
    redis_prefix: str = field(
        default=DEFAULT_PREFIX, metadata={"help": "Prefix of every Redis key (as on workers)."}
    )
    served_model_name: str | None = field(
        default=None,
        metadata={
            "help": "The model name clients use; only workers announcing it get "
            "traffic (default: the name the first worker announces)."
        },
    )
    tokenizer: str | None = field(
        default=None,
        metadata={"help": "Tokenizer folder or Hub id (default: what the workers announce)."},
    )
    chat_template: str | None = field(
        default=None,
        metadata={
            "help": "Chat template: a Jinja file or the template itself (default: the tokenizer's)."
        },
    )
    enable_auto_tool_choice: bool = field(
        default=False,
        metadata={"help": 'Allow tool_choice "auto": parse the model\'s own tool calls.'},
    )
    tool_call_parser: str | None = field(
        default=None,
        metadata={
            "help": "How the model writes tool calls: hermes (Qwen2.5, Qwen3), llama3_json, "
            "mistral.",
            "choices": TOOL_CALL_PARSERS,
        },
    )
    reasoning_parser: str | None = field(
        default=None,
        metadata={
            "help": "Split <think>...</think> into reasoning_content: qwen3, deepseek_r1.",
            "choices": REASONING_PARSERS,
        },
    )
    api_key: str | None = field(
        default_factory=env.api_key,
        metadata={"help": "Key clients must send as a Bearer token (default: $PAGODA_API_KEY)."},
    )
    routing_policy: str = field(
        default="affinity",
        metadata={
            "help": "affinity: lowest estimated time to first token, counting cached "
            "prefixes; load: least loaded only.",
            "choices": ROUTING_POLICIES,
        },
    )
    affinity_threshold: float = field(
        default=0.3,
        metadata={
            "help": "Fraction of the prompt a cached prefix must cover to count; shorter "
            "ones (a shared template head) do not pull requests to one worker."
        },
    )
    choice_ttl: float | None = field(
        default=None,
        metadata={
            "help": "Seconds a routing choice counts as the worker holding the prompt "
            f"(default: {CHOICE_TTL_WITH_REDIS_S:g} with Redis, "
            f"{CHOICE_TTL_LOCAL_S:g} without)."
        },
    )
    max_attempts: int = field(
        default=3,
        metadata={"help": "Workers one request may try when they fail before its first token."},
    )
    migration_limit: int = field(
        default=3,
        metadata={
            "help": "Times a request whose worker fails after tokens have streamed is "
            "resumed on another worker, with the tokens so far (0: the stream ends with "
            "an error instead)."
        },
    )
    worker_stall_timeout: float = field(
        default=15.0,
        metadata={
            "help": "Seconds a worker may stay silent (no load report, no token on any "
            "stream) before it counts as hung: its streams move to other workers."
        },
    )
    request_timeout: float | None = field(
        default=None,
        metadata={
            "help": "Seconds a request may run, from its arrival, before it ends with an "
            "error (504 / DEADLINE_EXCEEDED) and its worker call is cancelled "
            "(default: no limit)."
        },
    )
    tokenizer_threads: int = field(
        default=2, metadata={"help": "Threads that tokenize and render chat templates."}
    )
    load_interval: float = field(
        default=0.5, metadata={"help": "Seconds between polls of each worker's load."}
    )
    discovery_interval: float = field(
        default=1.0, metadata={"help": "Seconds between reads of the Redis worker registry."}
    )
    worker_metrics_url: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "[NAME=]URL of a worker's metrics whose series GET /metrics includes, "
            "labelled worker=NAME (default: the URL's host:port); repeatable; pagoda serve "
            "sets them for its workers."
        },
    )
    enable_request_id_headers: bool = field(
        default=False,
        metadata={
            "help": "Answer with the request's X-Request-Id header (the client's, or the id "
            "the router gave it); the client's is used for response ids either way."
        },
    )
    disable_log_requests: bool = field(
        default=False, metadata={"help": "No access log line per HTTP request."}
    )
    shutdown_timeout: float = field(
        default=30.0, metadata={"help": "Seconds open requests get to finish on shutdown."}
    )
    # ---- limits: each a 400 (413, 415) naming what to change ----
    max_request_body_bytes: int = field(
        default=DEFAULT_MAX_BODY_BYTES,
        metadata={"help": "Largest HTTP request body accepted (413 beyond)."},
    )
    max_prompt_chars: int | None = field(
        default=None,
        metadata={
            "help": "Longest prompt text, in characters, checked before tokenizing "
            "(default: max_model_len times the longest token's length, which no prompt "
            "that fits can exceed)."
        },
    )
    max_tokens_per_request: int = field(
        default=DEFAULT_MAX_TOKENS_PER_REQUEST,
        metadata={
            "help": "Bound on n x max_tokens summed over a request's prompts: the most "
            "tokens one request may ask the workers to generate."
        },
    )
    max_chat_messages: int = field(
        default=DEFAULT_MAX_CHAT_MESSAGES,
        metadata={"help": "Most messages one chat request may carry (400 beyond)."},
    )
    timeout_keep_alive: float = field(
        default=DEFAULT_TIMEOUT_KEEP_ALIVE_S,
        metadata={
            "help": "Seconds an idle HTTP keep-alive connection stays open. Longer than "
            "clients keep theirs (httpx and the openai SDK: 5 s; load balancers: 60 s), "
            "so that the client, not the router, closes an idle connection: a router "
            "closing it as a client reuses it fails that request."
        },
    )

    def __post_init__(self) -> None:
        _port("port", self.port)
        _port("grpc-port", self.grpc_port)
        for address in self.worker:
            host, _, port = address.rpartition(":")
            if not host or not port.isdigit():
                raise ConfigError(f"--worker must be host:port, got {address!r}")
        if self.routing_policy not in ROUTING_POLICIES:
            raise ConfigError(
                f"--routing-policy must be one of {', '.join(ROUTING_POLICIES)}, "
                f"got {self.routing_policy!r}"
            )
        if self.migration_limit < 0:
            raise ConfigError(f"--migration-limit must be >= 0, got {self.migration_limit}")
        for name in (
            "choice_ttl",
            "load_interval",
            "discovery_interval",
            "worker_stall_timeout",
            "request_timeout",
        ):
            _positive(name, getattr(self, name))
        if not 0 <= self.affinity_threshold <= 1:
            raise ConfigError(
                f"--affinity-threshold must be in [0, 1], got {self.affinity_threshold}"
            )
        _positive("max_attempts", self.max_attempts)
        for name in (
            "max_request_body_bytes",
            "max_prompt_chars",
            "max_tokens_per_request",
            "max_chat_messages",
            "timeout_keep_alive",
        ):
            _positive(name, getattr(self, name))
        _positive("tokenizer_threads", self.tokenizer_threads)
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise ConfigError("--enable-auto-tool-choice needs a --tool-call-parser")
        for flag, value, names in (
            ("tool-call-parser", self.tool_call_parser, TOOL_CALL_PARSERS),
            ("reasoning-parser", self.reasoning_parser, REASONING_PARSERS),
        ):
            if value is not None and value not in names:
                raise ConfigError(f"--{flag} must be one of {', '.join(names)}, got {value!r}")
        if self.shutdown_timeout < 0:
            raise ConfigError(f"--shutdown-timeout must be >= 0, got {self.shutdown_timeout}")
        if not self.redis_prefix:
            raise ConfigError("--redis-prefix must not be empty")

    def check_has_workers(self) -> None:
        if not self.worker and not self.redis_url:
            raise ConfigError(
                "no workers to route to: give --worker host:port (repeatable) or "
                "--redis-url (or set REDIS_URL) to discover them"
            )

    @property
    def effective_choice_ttl(self) -> float:
        if self.choice_ttl is not None:
            return self.choice_ttl
        return CHOICE_TTL_WITH_REDIS_S if self.redis_url else CHOICE_TTL_LOCAL_S
