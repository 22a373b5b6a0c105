// Jobs: live state and progress for the rows on this page; new jobs are announced, not pushed in.
import { el, fmtBytes } from "./api.js";
import { onLive } from "./live.js";

let unseen = 0;
onLive((msg) => {
  if (msg.type !== "delta" || !msg.jobs) return;
  for (const job of msg.jobs) {
    const row = document.querySelector(`tr[data-job="${job.job_id}"]`);
    if (!row) { unseen++; continue; }
    if (job.state) {
      const s = row.querySelector('[data-field="state"]');
      s.textContent = job.state;
      s.className = `state state-${job.state}`;
    }
    if (job.bytes_done !== undefined) {
      const total = Number(row.dataset.bytes) || 1;
      const pct = Math.min(100, (100 * job.bytes_done) / total);
      row.querySelector('[data-field="bar"]').style.width = `${pct}%`;
      row.querySelector(".progress").setAttribute("aria-valuenow", pct.toFixed(0));
      row.querySelector('[data-field="done"]').textContent = fmtBytes(job.bytes_done);
    }
    // "" clears the cell: a later attempt landed, the earlier one's error is in the history.
    if (job.error !== undefined) row.querySelector('[data-field="error"]').textContent = job.error;
  }
  if (unseen) {
    document.getElementById("new-jobs").replaceChildren(
      el("a", { href: location.pathname + location.search, text: `${unseen} update(s) for jobs not shown: reload` }));
  }
});
