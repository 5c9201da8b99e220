"""TorchState: the State of a PyTorch training loop, as Horovod's. Models,
optimizers and ElasticSamplers given to it are saved, restored and synced by
a handler of their type; every other keyword argument is a plain attribute
(ObjectState)."""
import copy

import torch

from hora.common.elastic import ObjectState
from hora.torch.elastic.sampler import ElasticSampler
from hora.torch.functions import (allgather_object, broadcast_object, broadcast_optimizer_state,
                                  broadcast_parameters)
from hora.torch.mpi_ops import rank

__all__ = ["TorchState", "StateHandler", "ModelStateHandler", "OptimizerStateHandler",
           "SamplerStateHandler", "get_handler_registry", "set_handler_registry"]


class StateHandler:
    """Saves, restores and syncs one object of a TorchState."""

    def __init__(self, value):
        self.value = value

    def save(self):
        raise NotImplementedError()

    def restore(self):
        raise NotImplementedError()

    def sync(self):
        raise NotImplementedError()

    def set_value(self, value):
        """The attribute was given a new object: it is saved at once."""
        self.value = value
        self.save()


class _StateDictHandler(StateHandler):
    """An object with state_dict and load_state_dict, saved as a deep copy of
    its state_dict (where its tensors are: on the GPU for a CUDA model)."""

    def __init__(self, value):
        super().__init__(value)
        self.save()

    def save(self):
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self._saved)


class ModelStateHandler(_StateDictHandler):
    def sync(self):
        # Parameters and buffers, in place.
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class OptimizerStateHandler(_StateDictHandler):
    def sync(self):
        broadcast_optimizer_state(self.value, root_rank=0)


class SamplerStateHandler(_StateDictHandler):
    def sync(self):
        state = self.value.state_dict()
        # Indices recorded by record_indices are each rank's own: all of them
        # count as processed.
        done = set().union(*allgather_object(state["processed_indices"],
                                             name="elastic.sampler.indices"))
        state = broadcast_object(state, root_rank=0, name="elastic.sampler")
        state["processed_indices"] = done
        self.value.load_state_dict(state)


_handler_registry = [
    (torch.nn.Module, ModelStateHandler),
    (torch.optim.Optimizer, OptimizerStateHandler),
    (ElasticSampler, SamplerStateHandler),
]


def get_handler_registry():
    """[(type, handler class)], tried in order for each TorchState argument."""
    return _handler_registry


def set_handler_registry(registry):
    global _handler_registry
    _handler_registry = registry


def _handler_for(value):
    for kind, handler in _handler_registry:
        if isinstance(value, kind):
            return handler(value)
    return None


class TorchState(ObjectState):
    """The state of a PyTorch training loop: TorchState(model, optimizer,
    epoch=0, batch=0, sampler=my_sampler, ...). Every argument becomes an
    attribute. Models are saved as a copy of their state_dict and synced by
    broadcasting rank 0's parameters and buffers; optimizers as a copy of
    their state_dict and synced with broadcast_optimizer_state; an
    ElasticSampler as its progress, synced so that what is left of the epoch
    is split over the ranks there are now; the rest as Python objects.
    Assigning a new model (optimizer, ...) to the attribute saves it."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        kwargs["model"] = model
        kwargs["optimizer"] = optimizer
        handlers, plain = {}, {}
        for name, value in kwargs.items():
            h = _handler_for(value)
            if h is None:
                plain[name] = value
            else:
                handlers[name] = h
        self._handlers = handlers
        for name, h in handlers.items():
            setattr(self, name, h.value)
        super().__init__(broadcast_object, rank, **plain)

    def __setattr__(self, name, value):
        handlers = self.__dict__.get("_handlers")
        if handlers and name in handlers and name in self.__dict__:
            handlers[name].set_value(value)
        super().__setattr__(name, value)

    def save(self):
        for h in self._handlers.values():
            h.save()
        super().save()

    def restore(self):
        for h in self._handlers.values():
            h.restore()
        super().restore()

    def sync(self):
        # Models last: a rank whose optimizer has no state yet makes it with
        # a step (see broadcast_optimizer_state), which weight decay turns
        # into a change of the parameters; the model's broadcast then undoes it.
        ordered = sorted(self._handlers.values(), key=lambda h: isinstance(h, ModelStateHandler))
        for h in ordered:
            h.sync()
        super().sync()
