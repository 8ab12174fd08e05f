"""Saving a fitted Laplace approximation: laplace-torch's ``state_dict`` / ``load_state_dict``, and
pickling (``torch.save`` of the whole object) -- a mixin of the Laplace classes
(:mod:`vmfdist.laplace.kron`)."""
from __future__ import annotations

import torch

from ..curvature import KroneckerFactor
from .blocks import ParameterLayout


class SavingMixin:
    """``state_dict``, ``load_state_dict`` and the pickling hooks of the Laplace classes."""

    _FACTOR_FIELDS = ("A", "G", "d_a", "q_a", "d_g", "q_g", "moments")

    def state_dict(self) -> dict:
        """Everything a fitted approximation holds -- the mean, the curvature (each block's factors,
        eigenbases and moments, and the per-layer sums that ``fit(override=False)`` extends), the
        hyper-parameters and the data counts -- as tensors and plain values, for ``torch.save``.
        As in laplace-torch the model is not included: save it with its own ``state_dict``, and
        give :meth:`load_state_dict` an approximation built on the same model (at the same
        parameters)."""
        self._check_fitted()
        by_name = {b.module_name: id(b.module) for b in self._blocks}
        return {
            "cls_name": type(self).__name__, "likelihood": self.likelihood,
            "subset_of_weights": self.subset_of_weights, "last_layer_name": self.last_layer_name,
            "blocks": [b.name for b in self._blocks], "fisher_type": self.fisher_type,
            "separate_weight_and_bias": self.separate_weight_and_bias, "damping": self.damping,
            "temperature": self.temperature, "enable_backprop": self.enable_backprop,
            "mean": self.mean, "loss": self.loss, "n_data": self.n_data, "n_outputs": self.n_outputs,
            "prior_mean": self.prior_mean, "prior_precision": self.prior_precision, "sigma_noise": self.sigma_noise,
            "factors": [{k: getattr(b.factor, k) for k in self._FACTOR_FIELDS} for b in self._blocks],
            "sums": {name: (self._sums[i].A, self._sums[i].G) for name, i in by_name.items() if i in self._sums},
        }

    # pickling (torch.save of the whole object): the layout and the per-layer sums are keyed by the
    # ids of parameters and modules, which unpickled copies do not keep
    def __getstate__(self):
        state = self.__dict__.copy()
        state["_layout"] = None
        if self._sums is not None:
            names = {id(b.module): b.module_name for b in self._blocks}
            state["_sums"] = {names[i]: f for i, f in self._sums.items()}
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._layout = ParameterLayout(self.params)
        self._precision.layout = self._layout
        if self._sums is not None:
            layers = self._layers_dict()
            self._sums = {id(layers[name]): f for name, f in self._sums.items()}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore a fit saved by :meth:`state_dict` into this approximation, which must be of the
        same class, likelihood and structure (the same blocks) over the same model; the model
        itself is not touched (as in laplace-torch)."""
        owner = type(self).__name__
        if not isinstance(state_dict, dict) or "cls_name" not in state_dict:
            raise ValueError(f"{owner}.load_state_dict: state_dict must be a dict from {owner}.state_dict()")
        if state_dict["cls_name"] != owner:
            raise ValueError(f"{owner}.load_state_dict: the state is of a {state_dict['cls_name']}; build the "
                             f"same class (subset_of_weights and hessian_structure) to load it")
        for key in ("likelihood", "subset_of_weights", "fisher_type", "separate_weight_and_bias", "damping"):
            if getattr(self, key) != state_dict[key]:
                raise ValueError(f"{owner}.load_state_dict: {key} is {getattr(self, key)!r} here but "
                                 f"{state_dict[key]!r} in the state")
        if self.subset_of_weights == "last_layer" and state_dict["last_layer_name"] != self.last_layer_name:
            if self.last_layer_name is not None and self._last_layer_found:
                raise ValueError(f"{owner}.load_state_dict: the last layer is {self.last_layer_name!r} here but "
                                 f"{state_dict['last_layer_name']!r} in the state")
            self._setup_blocks([state_dict["last_layer_name"]])
            self.last_layer_name = state_dict["last_layer_name"]
        self._last_layer_found = True
        names = [b.name for b in self._blocks]
        if names != state_dict["blocks"]:
            raise ValueError(f"{owner}.load_state_dict: the blocks here {names} differ from the state's "
                             f"{state_dict['blocks']}")
        mean = state_dict["mean"]
        if mean.shape != (self.n_params,):
            raise ValueError(f"{owner}.load_state_dict: the state's mean has {mean.numel()} entries, this model "
                             f"{self.n_params} parameters")
        dev, dt = self._device, self._dtype

        def to(t):
            return None if t is None else t.to(device=dev, dtype=dt)

        for b, f in zip(self._blocks, state_dict["factors"]):
            b.factor = KroneckerFactor(to(f["A"]), to(f["G"]))
            for k in self._FACTOR_FIELDS[2:]:
                setattr(b.factor, k, to(f[k]))
        layers = self._layers_dict()
        self._sums = {id(layers[name]): KroneckerFactor(to(A), to(G)) for name, (A, G) in state_dict["sums"].items()}
        self.temperature, self.enable_backprop = state_dict["temperature"], state_dict["enable_backprop"]
        self.sigma_noise = state_dict["sigma_noise"]
        self.prior_precision = state_dict["prior_precision"]
        self.prior_mean = state_dict["prior_mean"]
        self.mean = to(mean)
        loss = state_dict["loss"]
        self.loss = to(loss) if isinstance(loss, torch.Tensor) else loss
        self.n_data, self.n_outputs = state_dict["n_data"], state_dict["n_outputs"]
        self._fitted = True
