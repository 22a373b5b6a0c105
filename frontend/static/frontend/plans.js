// Plans: approve / reject a whole plan or selected items through the REST API; live plan states.
import { api, el, showNotice } from "./api.js";
import { onLive } from "./live.js";

const form = document.getElementById("decide");
const result = document.getElementById("result");

function applyPlan(plan) {
  const badge = document.getElementById("plan-state");
  if (badge) { badge.textContent = plan.state; badge.className = `state state-${plan.state}`; }
  for (const item of plan.items) {
    const row = document.querySelector(`tr[data-item="${item.id}"]`);
    if (!row) continue;
    const decision = row.querySelector('[data-field="decision"]');
    decision.textContent = item.decision;
    decision.className = `state state-${item.decision}`;
    row.querySelector('[data-field="refusal"]').textContent = item.refusal;
    const box = row.querySelector('input[name="item"]');
    if (box) { box.checked = false; box.disabled = item.decision !== "pending"; }
  }
}

async function decide(approve, scope) {
  const body = { reason: form.querySelector('input[name="reason"]')?.value || "" };
  if (scope === "selected") {
    body.items = [...form.querySelectorAll('input[name="item"]:checked')].map((b) => Number(b.value));
    if (!body.items.length) { showNotice(result, "warn", "Select at least one item first."); return; }
  }
  const verb = approve ? "approve" : "reject";
  try {
    const out = await api("POST", `/api/plans/${form.dataset.plan}/${verb}/`, body);
    applyPlan(out.plan);
    const refused = Object.entries(out.refused);
    if (!refused.length) {
      showNotice(result, "ok", `Plan ${out.plan.state}.`);
    } else {
      const list = el("ul");
      for (const [id, why] of refused) list.append(el("li", { text: `item #${id}: ${why}` }));
      result.replaceChildren(el("div", { class: "notice warn", role: "alert" },
        el("b", { text: `${refused.length} item(s) refused, nothing changed for them:` }), list));
    }
  } catch (err) {
    showNotice(result, "error", `Could not ${verb}: ${err.body?.detail || err.status}`);
  }
}

if (form) {
  form.addEventListener("click", (ev) => {
    const button = ev.target.closest("button[data-approve]");
    if (button) decide(button.dataset.approve === "1", button.dataset.scope);
  });
}

onLive((msg) => {
  if (msg.type !== "delta" || !msg.plans) return;
  for (const p of msg.plans) {
    const row = document.querySelector(`tr[data-plan="${p.plan_id}"] [data-field="state"]`);
    if (row && p.state) { row.textContent = p.state; row.className = `state state-${p.state}`; }
    else if (!row && !form) {
      const note = document.getElementById("new-plans");
      if (note) note.replaceChildren(el("a", { href: location.pathname, text: "New plans: reload" }));
    }
  }
});
