"""ElasticSampler: Horovod's sampler that splits what is left of an epoch
over the ranks there are now."""
import math
import random

import torch.utils.data

from hora.torch.mpi_ops import rank, size

__all__ = ["ElasticSampler"]


class ElasticSampler(torch.utils.data.Sampler):
    """Splits a dataset over the ranks as DistributedSampler does, and splits
    the samples an epoch has not processed yet again when the ranks change.

    The epoch's order is the dataset's (shuffled by seed + epoch when
    shuffle, the same on every rank). Record progress with record_batch
    (samples taken in order, on every rank) or record_indices (the samples
    this rank processed); keep the sampler in a TorchState, which saves,
    restores and syncs its progress and so splits what is left after a
    reset; call set_epoch at the end of an epoch (not the start) to begin
    the next one. Each rank gets ceil(left / size) samples, the first ones
    again at the end where they do not divide evenly."""

    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0  # samples of the epoch's order, from its start, done by all ranks
        self.processed_indices = set()  # dataset indices done (record_indices)
        self.num_replicas = 0
        self.rank = 0
        self.remaining_indices = []
        self.num_samples = 0
        self.total_size = 0
        self.indices = []
        self.reset()

    def set_epoch(self, epoch):
        """Starts epoch `epoch` from its beginning (its own order when shuffled)."""
        self.epoch = epoch
        self.processed_num = 0
        self.processed_indices = set()
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        """Counts a batch of batch_size samples on every rank as processed
        (each rank calls it for its own batch)."""
        self.processed_num += batch_size * self.num_replicas

    def record_indices(self, indices):
        """Marks dataset indices this rank processed; a sync gathers every
        rank's (Horovod's earlier sampler kept progress this way)."""
        self.processed_indices.update(int(i) for i in indices)

    def state_dict(self):
        return dict(epoch=self.epoch, processed_num=self.processed_num,
                    processed_indices=set(self.processed_indices))

    def load_state_dict(self, state_dict):
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict["processed_num"]
        self.processed_indices = set(state_dict.get("processed_indices", ()))
        self.reset()

    def reset(self):
        """Splits what is left of the epoch over the ranks there are now."""
        self.num_replicas = size()
        self.rank = rank()
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        left = order[self.processed_num:]
        if self.processed_indices:
            left = [i for i in left if i not in self.processed_indices]
        self.remaining_indices = left
        self.num_samples = math.ceil(len(left) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self):
        left = self.remaining_indices
        padded = list(left)
        # Repeats from the start until every rank has num_samples (more than
        # once where fewer samples are left than ranks).
        while left and len(padded) < self.total_size:
            padded += left[:self.total_size - len(padded)]
        self.indices = padded[self.rank:self.total_size:self.num_replicas]
        return iter(self.indices)

    def __len__(self):
        return self.num_samples
