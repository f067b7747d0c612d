"""A memory's folder on disk: files and their durability, the writer's lock, the
write-ahead log and its records, the commit format (checkpoints and saves) and the
validation every reader runs; older folder formats are read here too.

Nothing here knows how a memory searches: :mod:`memgas_gpu.memory` hands its state in
and takes parts back.  See docs/index-format.md and docs/failure.md.
"""
