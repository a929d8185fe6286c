"""tetriserve's gRPC client SDK (grpcio + protobuf only; no Ray, no torch).

``TetriServeClient`` blocks, ``AsyncTetriServeClient`` uses ``grpc.aio``; both
stream ``Chunk``s from ``generate()``, collect a ``Completion`` with
``complete()``, and offer ``abort()``, ``health()``, ``cluster_status()`` and the
admin calls ``set_policy()``, ``flip()`` and ``scale()``.
Failures raise subclasses of ``client.errors.TetriServeError``. Both take ``api_key=`` (default
``$TETRISERVE_API_KEY``) and ``tls=True`` / ``root_certificates=`` (``client.credentials``).
"""

from tetriserve.client.async_client import AsyncResponseStream, AsyncTetriServeClient
from tetriserve.client.errors import (
    Cancelled,
    DeadlineExceeded,
    FailedPrecondition,
    InternalError,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    TetriServeError,
    Unauthenticated,
    Unavailable,
)
from tetriserve.client.options import GenerateOptions
from tetriserve.client.results import (
    Chunk,
    ClusterStatus,
    Completion,
    HealthStatus,
    PolicyUpdate,
    TokenLogprob,
    Usage,
    WorkerInfo,
    WorkerPolicy,
)
from tetriserve.client.retry import NO_RETRY, RetryPolicy
from tetriserve.client.sync_client import ResponseStream, TetriServeClient

__all__ = [
    "NO_RETRY",
    "AsyncResponseStream",
    "AsyncTetriServeClient",
    "Cancelled",
    "Chunk",
    "ClusterStatus",
    "Completion",
    "DeadlineExceeded",
    "FailedPrecondition",
    "GenerateOptions",
    "HealthStatus",
    "InternalError",
    "InvalidArgument",
    "NotFound",
    "PolicyUpdate",
    "ResourceExhausted",
    "ResponseStream",
    "RetryPolicy",
    "TetriServeClient",
    "TetriServeError",
    "TokenLogprob",
    "Unauthenticated",
    "Unavailable",
    "Usage",
    "WorkerInfo",
    "WorkerPolicy",
]
