"""A toy model family, outside fastvideo/: proves a second family plugs in without an edit there.

Its "transformer" is one linear map of the packed latent plus a per-sample text vector, scaled by
sigma; its "VAE" reshapes the tokens into an image. Loading is not supported (nothing to load).
Registered as "toy" on import; also usable as "toy_family:ToyFamily".
"""

from __future__ import annotations

import torch

from fastvideo.models import base, registry


class ToyTransformer(torch.nn.Module):
    def __init__(self, channels: int = 3, text_dim: int = 5):
        super().__init__()
        self.proj = torch.nn.Linear(channels, channels)
        self.text = torch.nn.Linear(text_dim, channels)

    def forward(self, x, sigma, text):  # x [B, L, C], sigma [B], text [B, T]
        return self.proj(x) * sigma.view(-1, 1, 1) + self.text(text).unsqueeze(1)


class ToyVAE(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(()))


class ToyFamily(base.ModelFamily):
    name = "toy"
    export_class_name = "ToyTransformer"
    storage = (base.StoredTensor("text", "text_path", "text"),)
    json_keys = ("text_path", "caption")

    def __init__(self, offset: float = 0.0, **ignored):
        self.offset = offset

    def check_folder(self, path, components=None):
        raise NotImplementedError

    def transformer_class(self):
        return ToyTransformer

    def load_transformer(self, root, subfolder, device, dtype):
        raise NotImplementedError

    def meta_transformer(self, config, dtype):
        with torch.device("meta"):
            return ToyTransformer().to(dtype)

    def adapt_for_device(self, transformer, device):
        pass

    def load_vae(self, path, device="cpu", dtype=torch.float32):
        return ToyVAE()

    def load_text_encoders(self, path, device="cpu", dtype=torch.float32):
        return None

    def block_classes(self):
        return (torch.nn.Linear,)

    def encode_prompts(self, encoders, prompts, max_sequence_length=0):
        text = torch.stack([torch.full((5,), float(len(p))) for p in prompts])
        return base.TensorConditioning({"text": text})

    def cond_from_tensors(self, records):
        return base.TensorConditioning({"text": torch.stack([r["text"] for r in records])})

    def check_record(self, idx, record, first_dims=None, where=""):
        return record, tuple(record["text"].shape)

    def check_dims(self, dims, transformer_config, max_sequence_length=None):
        pass

    def encoder_dims(self, encoders):
        return {}

    def record_shapes(self, max_sequence_length, encoder_dims):
        return ((5,),)

    def layout(self, height, width, vae, transformer=None, device=None):
        return base.LatentLayout(height, width, tokens=(height * width, 3), latent_hw=(height, width))

    def velocity(self, transformer, x, sigma, cond, layout):
        sig = torch.as_tensor(sigma, dtype=torch.float32).expand(x.shape[0]) + self.offset
        return transformer(x, sig, cond["text"]).float()

    def decode(self, vae, x0, layout):
        b = x0.shape[0]
        img = x0.transpose(1, 2).reshape(b, 3, layout.height, layout.width)
        return (img * vae.scale / 2 + 0.5).clamp(0, 1)


registry.register_model_family("toy", ToyFamily)
