"""Stand-in interception-library regions: :mod:`gpupool.testing.shim_regions`, where the reclaim
benchmark imports them too."""

from gpupool.testing.shim_regions import MIB, USED_FIELD, UTIL_FIELD, region_bytes, region_path, write_region

__all__ = ["MIB", "USED_FIELD", "UTIL_FIELD", "region_bytes", "region_path", "write_region"]
