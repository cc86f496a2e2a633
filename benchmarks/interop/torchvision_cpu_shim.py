# dspark-tune interop venv shim (not part of any package; installed by hand).
# The only torchvision wheels on PyPI are CUDA builds; with the local CPU torch their
# torchvision/_C.so cannot load (needs libtorch_cuda.so), and
# torchvision/_meta_registrations.py then fails at import on its two unguarded
# `@torch.library.register_fake("torchvision::nms" / "torchvision::qnms")`.
# This finder defines those two schemas right before torchvision is first imported, so
# `import torchvision` (transforms etc.) succeeds; torchvision's C++ ops stay unavailable.
# It is lazy: torch is not imported at interpreter start-up.
import importlib.abc
import sys


class _TorchvisionShimFinder(importlib.abc.MetaPathFinder):
    done = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torchvision" or self.done:
            return None
        type(self).done = True
        try:
            import torch

            lib = torch.library.Library("torchvision", "FRAGMENT")
            for schema in (
                "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
                "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
            ):
                try:
                    lib.define(schema)
                except RuntimeError:
                    pass  # already defined by a working torchvision/_C.so
            globals()["_LIB"] = lib
        except Exception:
            pass
        return None  # let the normal finders load torchvision


sys.meta_path.insert(0, _TorchvisionShimFinder())
