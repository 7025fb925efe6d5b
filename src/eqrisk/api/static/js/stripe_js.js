// Stripe.js for the sign-up and account pages: loaded from where the server's options say
// (Stripe's own address, or a local stand-in in tests), once.

let loading = null;

export async function options() {
  const resp = await fetch("/api/signup/options");
  return resp.json();
}

export function loadStripe(opts) {
  if (!loading) {
    loading = new Promise((resolve, reject) => {
      const script = document.createElement("script");
      script.src = opts.stripe_js;
      script.onload = () => resolve(window.Stripe(opts.publishable_key));
      script.onerror = () => reject(new Error("Stripe.js could not be loaded"));
      document.head.appendChild(script);
    });
  }
  return loading;
}

export async function postJson(path, body, key) {
  const headers = { "Content-Type": "application/json" };
  if (key) headers.Authorization = `Bearer ${key}`;
  const resp = await fetch(path, { method: "POST", headers, body: JSON.stringify(body) });
  const doc = await resp.json().catch(() => ({}));
  return { status: resp.status, doc };
}

export function say(node, text, cls) {
  node.textContent = text;
  node.className = cls || "";
}
