// Calls the admin API, asking for the admin token when the daemon answers 401.
const TOKEN_KEY = "draftctl-admin-token";

export class AuthCancelled extends Error {}

export class AdminClient {
  constructor(dialog) {
    this.dialog = dialog;
    this.token = sessionStorage.getItem(TOKEN_KEY);
  }

  // fetch with the bearer token; on 401 prompt (when `prompt`) and retry until the token
  // works or the user cancels (AuthCancelled). Other statuses are returned to the caller.
  async request(method, path, { body, headers = {}, prompt = true } = {}) {
    let wrongToken = false;
    for (;;) {
      const all = { ...headers };
      if (this.token) all.Authorization = `Bearer ${this.token}`;
      const response = await fetch(path, { method, body, headers: all, cache: "no-store" });
      if (response.status !== 401) return response;
      if (!prompt) return response;
      const token = await this.askToken(wrongToken || Boolean(this.token));
      if (token === null) throw new AuthCancelled("admin token needed");
      this.setToken(token);
      wrongToken = true;
    }
  }

  setToken(token) {
    this.token = token;
    sessionStorage.setItem(TOKEN_KEY, token);
  }

  askToken(isRetry) {
    const { dialog } = this;
    const input = dialog.querySelector("#token-input");
    const error = dialog.querySelector("#token-error");
    error.hidden = !isRetry;
    error.textContent = isRetry ? "That token was rejected (401). Check the daemon's admin token." : "";
    input.value = "";
    return new Promise((resolve) => {
      dialog.addEventListener(
        "close",
        () => resolve(dialog.returnValue === "save" && input.value ? input.value : null),
        { once: true },
      );
      dialog.showModal();
      input.focus();
    });
  }
}
