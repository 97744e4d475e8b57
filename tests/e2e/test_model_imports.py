"""A GGUF imported on the registry page: the form uploads it, the page follows the import while it waits for the
user-code worker and until its model is listed, with where it came from.

The web_server fixture has no Celery worker: the import is converted here, in the test process (in the sandbox, as
the worker does), while the page polls it."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from rl_engine import sandbox
from tests.support.browser import PASSWORD, log_in, open_ready, screenshot
from tests.support.gguf_files import write_tiny_gguf
from tests.unit.platform.helpers import join

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not sandbox.status().available, reason="no sandbox to convert in"),
]


def test_a_gguf_uploaded_on_the_registry_page_is_followed_until_its_model_is_listed(
    web_server, page, settings, tmp_path, web_storage
):
    from posttrain.accounts.services import user_create
    from posttrain.registry.models import ModelImport
    from posttrain.registry.services import model_import_run

    settings.STORAGE_ROOT = web_storage  # the web server staged the upload there
    settings.GGUF_IMPORT_CHECK_VLLM = False
    settings.GGUF_IMPORT_DTYPE = "float32"
    join(user_create("grace", PASSWORD, "researcher"))
    gguf = write_tiny_gguf(tmp_path / "tiny-llama.gguf")

    log_in(page, web_server, "grace")
    open_ready(page, f"{web_server}/registry/")
    page.set_input_files("#gguf-file", str(gguf))
    page.fill("#gguf-name", "tiny-gguf")
    page.click("#gguf-form button[type=submit]")
    expect(page.locator('#gguf-import [data-state="queued"]')).to_contain_text("waiting for the user-code worker")

    model_import_run(ModelImport.objects.get(name="tiny-gguf").pk)  # the worker's part
    expect(page.locator('#gguf-import [data-state="done"]')).to_contain_text("Imported “tiny-gguf” from tiny-llama")
    row = page.locator("#model-rows tr").filter(has_text="tiny-gguf")
    expect(row).to_contain_text("GGUF import (Q8_0, F32)")
    expect(row).to_contain_text("LlamaForCausalLM")
    screenshot(page, "registry-gguf-import")

    page.set_input_files("#gguf-file", {"name": "notes.gguf", "mimeType": "text/plain", "buffer": b"just text"})
    page.click("#gguf-form button[type=submit]")
    expect(page.locator('#gguf-form .rf-field[data-field="file"] .field-error')).to_contain_text("not a GGUF file")
