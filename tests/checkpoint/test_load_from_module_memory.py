"""A deferred tensor loaded from the memory of one of the module's own real
tensors gets its own storage, as eager's ``load_state_dict`` (which copies
into each parameter) gives it: two parameters sharing memory that eager keeps
apart would silently see each other's later writes."""

import torch

import torchdefer


def build():
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))


def test_a_deferred_tensor_loaded_from_a_real_module_tensor_it_does_not_copy_into_owns_its_memory():
    torch.manual_seed(0)
    model = torchdefer.deferred_init(build)
    torchdefer.materialize_module(model[0])  # real, and not in the checkpoint
    source = {"1.weight": model[0].weight.detach(), "1.bias": model[0].bias.detach()}
    before = model[0].weight.detach().clone()

    torchdefer.load_state_dict(model, source)

    assert torch.equal(model[1].weight, before)
    assert model[1].weight.untyped_storage().data_ptr() != model[0].weight.untyped_storage().data_ptr()
    assert model[1].bias.untyped_storage().data_ptr() != model[0].bias.untyped_storage().data_ptr()
    with torch.no_grad():
        model[1].weight.add_(1)
    assert torch.equal(model[0].weight, before)  # eager: the two never shared


def test_a_deferred_tensor_loaded_from_a_fresh_state_dict_is_still_assigned_without_a_copy():
    torch.manual_seed(0)
    model = torchdefer.deferred_init(build)
    source = {"1.weight": torch.ones(4, 4)}
    torchdefer.load_state_dict(model, source)
    assert model[1].weight.data_ptr() == source["1.weight"].data_ptr()
