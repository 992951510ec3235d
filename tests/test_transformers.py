"""``attn_implementation="ioaware"`` in Hugging Face transformers (:mod:`ioaware.integrations.transformers`).

Small random models built from configs (no download: ``HF_HUB_OFFLINE=1``, no tokenizer):
Llama with grouped-query attention, GPT-2 (absolute positions), BERT (an encoder). Each is
compared with the same weights under ``attn_implementation="sdpa"``: logits at real tokens of a
padded batch, the loss and every parameter's gradient, and greedy ``generate`` (KV cache,
dynamic and static). The same tests run on a GPU in bfloat16 (``-m gpu``).

Tolerances, ours against PyTorch's SDPA in the same dtype: float32 — logits 1e-4 absolute
(both accumulate in float32; the model's layers add ~1e-6 relative per layer), gradients 1e-3
relative Frobenius; bfloat16 — logits 0.1 absolute (each attention output is rounded to
bfloat16, 2**-8 relative, on both sides independently); bfloat16 gradients are compared with
SDPA in float32 on the same weights: ours at most twice as far from it as SDPA in bfloat16.
"""
import copy
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

import ioaware.integrations.transformers as ioaware_hf  # noqa: E402

DEVICES = [pytest.param("cpu", torch.float32, id="cpu-float32"),
           pytest.param("cuda", torch.bfloat16, id="cuda-bfloat16", marks=pytest.mark.gpu)]
LOGIT_TOL = {torch.float32: 1e-4, torch.bfloat16: 1e-1}
GRAD_TOL = {torch.float32: 1e-3}
VOCAB = 101


@pytest.fixture(scope="module", autouse=True)
def registered():
    assert ioaware_hf.register() == "ioaware"


def llama_config(**kw):
    return transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, **kw)


def gpt2_config(**kw):
    return transformers.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                                   resid_pdrop=0.0, embd_pdrop=0.0, **kw)


def bert_config(**kw):
    return transformers.BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                   intermediate_size=128, max_position_embeddings=64, hidden_dropout_prob=0.0, **kw)


def pair(model_class, config, device, dtype):
    """The same random weights twice: under "sdpa" and under "ioaware" (separate config objects)."""
    torch.manual_seed(0)
    sdpa = model_class(copy.deepcopy(config)).to(device=device, dtype=dtype)
    ours = model_class(copy.deepcopy(config)).to(device=device, dtype=dtype)
    ours.load_state_dict(sdpa.state_dict())
    sdpa.set_attn_implementation("sdpa")
    ours.set_attn_implementation("ioaware")
    assert sdpa.config._attn_implementation == "sdpa" and ours.config._attn_implementation == "ioaware"
    return sdpa.eval(), ours.eval()


def batch(device, padding_side):
    """Three sequences of 11, 7 and 4 real tokens, padded with token 0 to 11 on ``padding_side``."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, VOCAB, (3, 11), generator=g)
    mask = torch.zeros(3, 11, dtype=torch.long)
    for row, n in enumerate((11, 7, 4)):
        mask[row, 11 - n:] = 1 if padding_side == "left" else 0
        mask[row, :n] = 1 if padding_side == "right" else mask[row, :n]
    ids = ids.masked_fill(mask == 0, 0)
    return ids.to(device), mask.to(device)


def assert_logits_close(a, b, mask, dtype):
    real = mask.bool()
    diff = (a.float() - b.float())[real].abs().max().item()
    assert diff <= LOGIT_TOL[dtype], diff


def assert_same_greedy_tokens(ours, sdpa, ids, dtype, **kw):
    """Greedy generation picks the same tokens. The first token where the two differ may differ
    only if the reference's logits there are a tie within the logit tolerance (in float32 that
    means equal; in bfloat16 a near-tie may fall either way); after it the sequences part."""
    kw = dict(max_new_tokens=8, do_sample=False, pad_token_id=0, **kw)
    want = sdpa.generate(ids, output_logits=True, return_dict_in_generate=True, **kw)
    got = ours.generate(ids, **kw)
    assert got.shape == want.sequences.shape
    new_got, new_want = got[:, ids.shape[1]:], want.sequences[:, ids.shape[1]:]
    for row in range(ids.shape[0]):
        differ = (new_got[row] != new_want[row]).nonzero()
        if len(differ):
            step = int(differ[0])
            logits = want.logits[step][row].float()
            margin = (logits[new_want[row, step]] - logits[new_got[row, step]]).item()
            assert margin <= 2 * LOGIT_TOL[dtype], (row, step, margin)


def training_step(model, ids, mask):
    """(loss, {parameter name: gradient}) of one step on ``ids`` (pads are not labels)."""
    model.zero_grad()
    loss = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
    loss.backward()
    return loss.detach().float(), {n: p.grad.float() for n, p in model.named_parameters()
                                   if p.grad is not None}


def assert_same_training_step(sdpa, ours, ids, mask, dtype):
    """In float32 the loss and every gradient equal SDPA's within GRAD_TOL. In bfloat16 two
    computations in the same low precision differ by their rounding, which grows through the
    layers (gradients of embeddings sum every position): there both are compared with SDPA on
    the same weights in float32, and ours may be at most twice as far from it as SDPA in
    bfloat16 is (plus GRAD_TOL[float32] relative)."""
    (loss_s, grad_s), (loss_o, grad_o) = training_step(sdpa, ids, mask), training_step(ours, ids, mask)
    assert grad_s.keys() == grad_o.keys() and len(grad_s) > 10
    if dtype == torch.float32:
        torch.testing.assert_close(loss_o, loss_s, atol=LOGIT_TOL[dtype], rtol=0)
        for name, want in grad_s.items():
            err = (grad_o[name] - want).norm()
            assert err <= GRAD_TOL[dtype] * want.norm() + 1e-6, (name, err.item(), want.norm().item())
        return
    loss_r, grad_r = training_step(copy.deepcopy(sdpa).float(), ids, mask)
    floor = GRAD_TOL[torch.float32]
    assert (loss_o - loss_r).abs() <= 2 * (loss_s - loss_r).abs() + LOGIT_TOL[dtype]
    for name, ref in grad_r.items():
        err_o, err_s = (grad_o[name] - ref).norm(), (grad_s[name] - ref).norm()
        assert err_o <= 2 * err_s + floor * ref.norm() + 1e-6, (name, err_o.item(), err_s.item())


@pytest.mark.parametrize("device, dtype", DEVICES)
def test_llama_with_grouped_query_attention(device, dtype):
    sdpa, ours = pair(transformers.LlamaForCausalLM, llama_config(), device, dtype)
    assert ours.model.layers[0].self_attn.num_key_value_groups == 2
    ids, mask = batch(device, "left")
    with torch.no_grad():
        assert_logits_close(ours(ids, attention_mask=mask).logits, sdpa(ids, attention_mask=mask).logits, mask, dtype)
    assert_same_training_step(sdpa, ours, ids, mask, dtype)
    for cache in ("dynamic", "static"):
        assert_same_greedy_tokens(ours, sdpa, ids, dtype, attention_mask=mask, cache_implementation=cache)
        # unpadded: the prefill runs with is_causal, each decoding step without a mask
        assert_same_greedy_tokens(ours, sdpa, ids[:1], dtype, cache_implementation=cache)


@pytest.mark.parametrize("device, dtype", DEVICES)
def test_gpt2_with_absolute_positions(device, dtype):
    sdpa, ours = pair(transformers.GPT2LMHeadModel, gpt2_config(), device, dtype)
    ids, mask = batch(device, "left")
    with torch.no_grad():
        assert_logits_close(ours(ids, attention_mask=mask).logits, sdpa(ids, attention_mask=mask).logits, mask, dtype)
    assert_same_training_step(sdpa, ours, ids, mask, dtype)
    assert_same_greedy_tokens(ours, sdpa, ids, dtype, attention_mask=mask)


@pytest.mark.parametrize("device, dtype", DEVICES)
def test_bert_encoder_with_padding(device, dtype):
    sdpa, ours = pair(transformers.BertForMaskedLM, bert_config(), device, dtype)
    ids, mask = batch(device, "right")
    with torch.no_grad():
        assert_logits_close(ours(ids, attention_mask=mask).logits, sdpa(ids, attention_mask=mask).logits, mask, dtype)
    assert_same_training_step(sdpa, ours, ids, mask, dtype)


@pytest.mark.parametrize("device, dtype", DEVICES)
def test_continuing_from_a_kv_cache_with_several_new_tokens(device, dtype):
    """More keys than queries (Nq = 3 > 1, a cache of 8): the mask carries the offsets."""
    sdpa, ours = pair(transformers.LlamaForCausalLM, llama_config(), device, dtype)
    ids, mask = batch(device, "left")
    logits = []
    with torch.no_grad():
        for model in (sdpa, ours):
            first = model(ids[:, :8], attention_mask=mask[:, :8], use_cache=True)
            logits.append(model(ids[:, 8:], attention_mask=mask, past_key_values=first.past_key_values).logits)
    assert_logits_close(logits[1], logits[0], mask[:, 8:], dtype)


@pytest.mark.parametrize("device, dtype", DEVICES)
def test_dropout_is_applied_in_training_only(device, dtype):
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(llama_config(attention_dropout=0.4)).to(device=device, dtype=dtype)
    model.set_attn_implementation("ioaware")
    ids, mask = batch(device, "left")
    model.train()
    torch.manual_seed(3)
    a = model(ids, attention_mask=mask).logits
    torch.manual_seed(3)
    b = model(ids, attention_mask=mask).logits
    torch.manual_seed(4)
    c = model(ids, attention_mask=mask).logits
    model.eval()
    d = model(ids, attention_mask=mask).logits
    torch.testing.assert_close(a, b, atol=0, rtol=0)          # torch.manual_seed reproduces it
    assert not torch.allclose(a, c) and not torch.allclose(a, d)
    torch.testing.assert_close(d, model(ids, attention_mask=mask).logits, atol=0, rtol=0)


def test_without_the_mask_function_padding_is_ignored():
    """Why register() also registers a mask function: with the attention function alone,
    transformers passes attention_mask=None and padded rows attend to pad tokens."""
    from transformers import AttentionInterface
    AttentionInterface.register("ioaware-attention-only", ioaware_hf.attention_forward)
    sdpa, ours = pair(transformers.LlamaForCausalLM, llama_config(), "cpu", torch.float32)
    ours.set_attn_implementation("ioaware-attention-only")
    ids, mask = batch("cpu", "left")
    with torch.no_grad():
        a, b = ours(ids, attention_mask=mask).logits, sdpa(ids, attention_mask=mask).logits
    assert (a - b)[mask.bool()].abs().max() > 1e-2


def test_no_mask_with_more_keys_than_queries_is_bottom_right():
    """attention_forward given no mask, is_causal and Nk > Nq (queries last, as after a cache)."""
    g = torch.Generator().manual_seed(2)
    q, k, v = torch.randn(1, 4, 3, 8, generator=g), torch.randn(1, 2, 7, 8, generator=g), torch.randn(1, 2, 7, 8, generator=g)
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = 2, True
    out, weights = ioaware_hf.attention_forward(module, q, k, v, None, scaling=0.5)
    allowed = torch.ones(3, 7, dtype=torch.bool).tril(diagonal=4)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=0.5, enable_gqa=True)
    assert weights is None and out.shape == (1, 3, 4, 8)
    torch.testing.assert_close(out, want.transpose(1, 2), atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("q_length, kv_length, q_offset, kv_offset, padded, skipped", [
    (5, 5, 0, 0, False, True),     # prefill, no padding: is_causal
    (1, 9, 8, 0, False, True),     # one new token at the end of the cache: no mask
    (5, 5, 0, 0, True, False),     # padding: materialised
    (5, 16, 0, 0, False, False),   # static cache prefill, empty slots after the queries
    (1, 16, 8, 0, False, False),   # static cache decoding
    (3, 9, 6, 0, False, False),    # several new tokens after a cache: materialised
])
def test_the_mask_is_left_out_only_where_is_causal_is_exact(q_length, kv_length, q_offset, kv_offset, padded,
                                                            skipped):
    seen = kv_offset + kv_length
    padding = torch.ones(2, min(seen, q_offset + q_length), dtype=torch.bool)
    if padded:
        padding[1, :2] = False
    mask = ioaware_hf.attention_mask(batch_size=2, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                                     kv_offset=kv_offset, attention_mask=padding)
    assert (mask is None) == skipped
    if mask is not None:
        rows = torch.arange(q_length)[:, None] + q_offset
        cols = torch.arange(kv_length)[None, :] + kv_offset
        want = (cols <= rows) & torch.nn.functional.pad(padding, (0, seen - padding.shape[1]))[:, None, None, :]
        assert torch.equal(mask, want.expand(2, 1, q_length, kv_length))
