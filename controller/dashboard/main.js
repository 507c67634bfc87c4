// Entry point: poll /api/stats, render, and keep the policy editor in step.
import { AdminClient } from "./admin_client.js";
import { PolicyEditor } from "./editor.js";
import { renderStats } from "./stats.js";

const params = new URLSearchParams(location.search);
const POLL_MS = Math.max(250, Number(params.get("interval_ms")) || 1000);

const conn = document.getElementById("conn-status");
const editor = new PolicyEditor(new AdminClient(document.getElementById("token-dialog")), {
  onChange: () => poll(),
});

async function poll() {
  try {
    const response = await fetch("/api/stats", { cache: "no-store" });
    if (!response.ok) throw new Error(`/api/stats answered ${response.status}`);
    const stats = await response.json();
    renderStats(stats);
    conn.textContent = `live · updated ${new Date().toLocaleTimeString()}`;
    conn.className = "conn ok";
    if (stats.policy) await editor.serverVersion(stats.policy.version);
  } catch (err) {
    conn.textContent = `disconnected: ${err.message}`;
    conn.className = "conn error";
  }
}

async function loop() {
  await poll();
  setTimeout(loop, POLL_MS);
}

editor.guard(() => editor.load(false));
loop();
