// The policy editor: load, validate on the server while typing, apply with If-Match,
// list versions and roll back. Talks only to /admin/policy*.
import { AuthCancelled } from "./admin_client.js";

const $ = (id) => document.getElementById(id);
const VALIDATE_DELAY_MS = 400;

export class PolicyEditor {
  constructor(admin, { onChange } = {}) {
    this.admin = admin;
    this.onChange = onChange || (() => {});
    this.etag = null;
    this.version = null;
    this.isDirty = false;
    this.isLocked = false;
    this.timer = null;
    this.text = $("policy-text");
    this.text.addEventListener("input", () => this.edited());
    $("btn-apply").addEventListener("click", () => this.guard(() => this.apply()));
    $("btn-validate").addEventListener("click", () => this.guard(() => this.validate()));
    $("btn-whatif").addEventListener("click", () => this.guard(() => this.whatIf()));
    $("btn-reload").addEventListener("click", () => this.guard(() => this.load(true)));
    $("btn-unlock").addEventListener("click", () => this.guard(() => this.load(true)));
  }

  // Run a user action; a cancelled token prompt just leaves a note.
  async guard(action) {
    try {
      await action();
    } catch (err) {
      if (err instanceof AuthCancelled) this.status("admin token needed for that", "error");
      else this.status(`request failed: ${err.message}`, "error");
    }
  }

  status(message, kind = "") {
    const node = $("editor-status");
    node.textContent = message;
    node.className = kind;
  }

  notice(message) {
    const node = $("editor-notice");
    node.hidden = !message;
    node.textContent = message || "";
  }

  setLocked(isLocked, message) {
    this.isLocked = isLocked;
    this.text.disabled = isLocked;
    for (const id of ["btn-apply", "btn-validate", "btn-whatif"]) $(id).disabled = isLocked;
    $("btn-unlock").hidden = !isLocked;
    if (isLocked) this.status(message, "error");
  }

  // prompt: whether a 401 opens the token dialog (true for user actions, not page load).
  async load(prompt = false) {
    const response = await this.admin.request("GET", "/admin/policy", { prompt });
    if (response.status === 401) return this.setLocked(true, "locked: this daemon needs its admin token");
    if (response.status === 403) {
      const body = await response.json();
      return this.setLocked(true, body.error.message);
    }
    if (!response.ok) return this.status(`could not load the policy (${response.status})`, "error");
    this.setLocked(false);
    this.text.value = await response.text();
    this.etag = response.headers.get("ETag");
    this.version = Number(response.headers.get("X-Draftctl-Policy-Version"));
    this.isDirty = false;
    this.showErrors([]);
    this.notice("");
    this.status(`loaded version ${this.version}`);
    await this.loadVersions();
  }

  // Called with each /api/stats policy version: follow server-side changes unless editing.
  async serverVersion(version) {
    if (this.isLocked || this.version === null || version === this.version) return;
    if (this.isDirty) {
      this.notice(`The running policy changed to version ${version} while you were editing version ${this.version}. Applying will be refused; reload first (copy your edit).`);
      return;
    }
    await this.load(false);
  }

  edited() {
    this.isDirty = true;
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.guard(() => this.validate()), VALIDATE_DELAY_MS);
  }

  async validate() {
    const response = await this.admin.request("POST", "/admin/policy/validate", {
      body: this.text.value, headers: { "Content-Type": "application/yaml" },
    });
    const body = await response.json();
    if (response.ok && body.ok) {
      this.showErrors([]);
      this.status("valid", "ok");
    } else if (response.ok) {
      this.showErrors(body.errors);
      this.status(`${body.errors.length} problem(s)`, "error");
    } else {
      this.status(body.error ? body.error.message : `validation failed (${response.status})`, "error");
    }
  }

  // The edit replayed on the recorded traffic, against the running policy's replay.
  async whatIf() {
    this.showWhatIf("replaying the recorded traffic under this edit…", "");
    const response = await this.admin.request("POST", "/admin/policy/whatif", {
      body: this.text.value, headers: { "Content-Type": "application/yaml" },
    });
    const body = await response.json();
    if (!response.ok) {
      return this.showWhatIf(body.error ? body.error.message : `what-if failed (${response.status})`, "error");
    }
    this.showWhatIf(describeWhatIf(body), "ok");
  }

  showWhatIf(message, kind) {
    const node = $("whatif");
    node.hidden = !message;
    node.textContent = message;
    node.className = kind;
  }

  async apply() {
    clearTimeout(this.timer);
    const headers = { "Content-Type": "application/yaml" };
    if (this.etag) headers["If-Match"] = this.etag;
    const response = await this.admin.request("PUT", "/admin/policy", { body: this.text.value, headers });
    const body = await response.json();
    if (response.status === 422) {
      this.showErrors(body.errors);
      return this.status(`not applied: ${body.errors.length} problem(s)`, "error");
    }
    if (response.status === 412) {
      return this.status("not applied: the policy changed on the server since you loaded it; reload, redo the edit, apply", "error");
    }
    if (!response.ok) return this.status(body.error ? body.error.message : `apply failed (${response.status})`, "error");
    await this.load(false);
    this.status(`applied: now version ${body.version}`, "ok");
    this.onChange(body.version);
  }

  async rollback(version) {
    const response = await this.admin.request("POST", "/admin/policy/rollback", {
      body: JSON.stringify({ version }), headers: { "Content-Type": "application/json" },
    });
    const body = await response.json();
    if (!response.ok) return this.status(body.error ? body.error.message : `rollback failed (${response.status})`, "error");
    await this.load(false);
    this.status(`rolled back to version ${version}: now version ${body.version}`, "ok");
    this.onChange(body.version);
  }

  showErrors(errors) {
    this.text.classList.toggle("invalid", errors.length > 0);
    $("policy-errors").replaceChildren(...errors.map((e) => this.errorItem(e)));
  }

  errorItem(error) {
    const li = document.createElement("li");
    const path = document.createElement("code");
    path.textContent = error.path || "<document>";
    li.append(path, `: ${error.message}`);
    if (error.line) {
      const jump = document.createElement("button");
      jump.type = "button";
      jump.className = "link";
      jump.textContent = `line ${error.line}`;
      jump.addEventListener("click", () => this.selectLine(error.line));
      li.append(" (", jump, ")");
    }
    return li;
  }

  selectLine(line) {
    const lines = this.text.value.split("\n");
    const start = lines.slice(0, line - 1).reduce((n, l) => n + l.length + 1, 0);
    this.text.focus();
    this.text.setSelectionRange(start, start + (lines[line - 1] || "").length);
  }

  async loadVersions() {
    const response = await this.admin.request("GET", "/admin/policy/versions", { prompt: false });
    if (!response.ok) return;
    const body = await response.json();
    $("versions").tBodies[0].replaceChildren(...body.versions.map((v) => this.versionRow(v)));
    const fileError = body.file && body.file.last_error;
    if (fileError && fileError.length) {
      const what = fileError.map((p) => `${p.path || "<document>"}: ${p.message}${p.line ? ` (line ${p.line})` : ""}`).join("; ");
      this.notice(`The policy file ${body.file.path} was rejected and the running version stays: ${what}`);
    }
  }

  versionRow(v) {
    const row = document.createElement("tr");
    row.dataset.version = String(v.version);
    if (v.is_current) row.className = "current";
    const when = new Date(v.created_s * 1000).toLocaleTimeString();
    for (const text of [`v${v.version}`, when, v.source]) {
      const td = document.createElement("td");
      td.textContent = text;
      row.append(td);
    }
    const action = document.createElement("td");
    if (v.is_current) {
      action.textContent = "running";
    } else {
      const button = document.createElement("button");
      button.type = "button";
      button.className = "link rollback";
      button.textContent = "roll back";
      button.addEventListener("click", () => this.guard(() => this.rollback(v.version)));
      action.append(button);
    }
    row.append(action);
    return row;
  }
}

const percent = (x) => (x === null || x === undefined ? "n/a" : `${x >= 0 ? "+" : ""}${(100 * x).toFixed(1)}%`);

// "on the last hour: +4.2% tok/s, TPOT p50 -3.1%, TTFT p50 +0.5% (120 requests) ..."
export function describeWhatIf(report) {
  const window = report.window_s >= 3600 ? `${(report.window_s / 3600).toFixed(report.window_s % 3600 ? 1 : 0)} h` : `${Math.round(report.window_s / 60)} min`;
  const d = report.delta;
  const recorded = report.recorded;
  const replay = report.reproduction_error === undefined ? "" : `; the running policy's replay is ${percent(report.reproduction_error)} off the recorded ${recorded.output_tok_s.toFixed(1)} tok/s`;
  return `on the last ${window === "1 h" ? "hour" : window}: ${percent(d.output_tok_s)} tok/s, TPOT p50 ${percent(d.tpot_p50)}, TTFT p50 ${percent(d.ttft_p50)} (${recorded.requests} requests, simulated against the running policy${replay})`;
}
