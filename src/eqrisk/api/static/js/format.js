// Number formatting and safe DOM building. Text from the API is only ever set as text (never as
// HTML); text handed to plotly, which understands a few tags, goes through `plain`.

const DASH = "\u2014";

export function fmtPct(value, digits = 1, signed = false) {
  if (value === null || value === undefined || Number.isNaN(value)) return DASH;
  const text = `${(value * 100).toFixed(digits)}%`;
  return signed && value > 0 ? `+${text}` : text;
}

export function fmtNum(value, digits = 2) {
  if (value === null || value === undefined || Number.isNaN(value)) return DASH;
  return value.toFixed(digits);
}

export function fmtUsd(value) {
  if (value === null || value === undefined || Number.isNaN(value)) return DASH;
  const abs = Math.abs(value);
  const sign = value < 0 ? "-" : "";
  for (const [size, unit] of [[1e12, "T"], [1e9, "B"], [1e6, "M"], [1e3, "k"]]) {
    if (abs >= size) return `${sign}$${(abs / size).toFixed(abs / size >= 100 ? 0 : 1)}${unit}`;
  }
  return `${sign}$${abs.toFixed(2)}`;
}

// A money amount in USD with enough digits for API prices (0.005) and balances (19.995).
export function fmtCredit(value) {
  if (value === null || value === undefined || Number.isNaN(value)) return DASH;
  return `${value.toFixed(value !== 0 && Math.abs(value) < 1 ? 4 : 2)} USD`;
}

export function plain(text) {
  return String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
}

// el("div", {class: "x", onclick: fn}, child, "text", ...): a DOM element; strings become text.
export function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (name === "dataset") Object.assign(node.dataset, value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export function debounce(fn, ms) {
  let timer = null;
  return (...args) => {
    clearTimeout(timer);
    timer = setTimeout(() => fn(...args), ms);
  };
}
