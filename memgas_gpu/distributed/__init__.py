"""Distributed indexing and evaluation on Ray (optional: ``pip install "memgas_gpu[ray]"``)."""
from .ray_backend import (INSTALL_HINT, RayEncoder, build_index_ray, init_ray,
                          ray_graph_mapper, require_ray, retrieve_ray)

__all__ = ["INSTALL_HINT", "RayEncoder", "build_index_ray", "init_ray", "ray_graph_mapper",
           "require_ray", "retrieve_ray"]
