// Edit forms (policies, overrides, a node's and a GPU's admin actions) submitted to the REST API:
// the server validates; errors are shown next to their fields and nothing is saved. A form with
// data-confirm asks first (a destructive action).
import { api, showNotice } from "./api.js";

function value(input) {
  const raw = input.type === "checkbox" ? input.checked : input.value.trim();
  switch (input.dataset.type) {
    case "int": return raw === "" ? null : (/^-?\d+$/.test(raw) ? Number(raw) : raw);
    case "float": return raw === "" ? null : (Number.isFinite(Number(raw)) ? Number(raw) : raw);
    case "id": return raw === "" ? null : Number(raw);
    case "keys": return raw === "" ? [] : raw.split(/[\s,]+/);
    case "datetime": return raw === "" ? null : new Date(raw).toISOString();
    default: return raw;
  }
}

function clearErrors(form) {
  form.querySelectorAll("[data-error]").forEach((e) => { e.textContent = ""; });
  form.querySelectorAll(".field-error").forEach((e) => e.classList.remove("field-error"));
}

function showErrors(form, body) {
  const errors = body.errors || (body.field ? { [body.field]: [body.detail] } : {});
  let placed = false;
  for (const [field, messages] of Object.entries(errors)) {
    const slot = form.querySelector(`[data-error="${field}"]`);
    if (!slot) continue;
    slot.textContent = [].concat(messages).join(" ");
    slot.closest("label").classList.add("field-error");
    placed = true;
  }
  const where = body.field ? ` (${body.field})` : "";
  showNotice(form.querySelector(".result"), "error",
    `Not saved${where}: ${body.detail || "invalid values"}${placed ? "" : ""}`);
}

for (const form of document.querySelectorAll("form[data-api]")) {
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    if (form.dataset.confirm && !window.confirm(form.dataset.confirm)) return;
    clearErrors(form);
    const body = {};
    for (const input of form.querySelectorAll("input[name], select[name], textarea[name]")) {
      if (input.name === "csrfmiddlewaretoken") continue;
      body[input.name] = value(input);
    }
    try {
      await api(form.dataset.method, form.dataset.api, body);
      showNotice(form.querySelector(".result"), "ok", "Saved.");
      setTimeout(() => location.reload(), 600);
    } catch (err) {
      showErrors(form, err.body || {});
    }
  });
}

for (const button of document.querySelectorAll("button[data-deactivate]")) {
  button.addEventListener("click", async () => {
    const box = document.getElementById("override-result");
    try {
      await api("PATCH", `/api/overrides/${button.dataset.deactivate}/`, { active: false });
      location.reload();
    } catch (err) {
      showNotice(box, "error", `Not changed: ${err.body?.detail || err.status}`);
    }
  });
}
