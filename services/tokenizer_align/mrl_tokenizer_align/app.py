"""Run the alignment service: `mrl align serve` (gRPC TokenizerAlign + REST twin)."""
import logging

from mrl_serving.server import ServiceServer, serve_service
from mrl.v1 import tokenizer_align_pb2
from mrl_tokenizer_align.registry import TokenizerRegistry
from mrl_tokenizer_align.service import Aligner, AlignServicer, create_rest_app
from mrl_tokenizer_align.settings import AlignSettings

__all__ = ["AlignServer", "serve"]

SERVICE = tokenizer_align_pb2.DESCRIPTOR.services_by_name["TokenizerAlign"]
log = logging.getLogger("mrl.align")


class AlignServer(ServiceServer):
    def __init__(self, settings: AlignSettings):
        super().__init__("tokenizer_align", settings)
        registry = TokenizerRegistry(settings.tokenizer_roots, settings.max_tokenizers)
        for tokenizer_id, path in settings.tokenizers.items():
            registry.register(tokenizer_id, path)
        if not settings.tokenizers:
            log.warning("no tokenizer preloaded: run `make tokenizers`, or set MRL_TOKENIZERS / RegisterTokenizer")
        self.aligner = Aligner(registry, settings)

    async def start(self) -> None:
        servicer = AlignServicer(self.aligner, self.auth, self.limiter)
        await super().start([(SERVICE, servicer)], create_rest_app(self.aligner, self.auth, self.limiter))


def serve(settings: AlignSettings | None = None) -> None:
    settings = settings or AlignSettings()
    serve_service("tokenizer_align", settings, lambda _: AlignServer(settings))
