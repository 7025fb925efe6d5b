// The rate limit's one wait (api.js keeps its deadline), shown in two places from that one
// deadline and by one timer: the account strip's "next in N s" and, while a request is held,
// the wait box above the view. Both read the same number at the same tick, so they never differ.
// "eqrisk:wait" (on document) says the wait changed or ended.

import { el } from "./format.js";
import { $, state } from "./state.js";

let timer = null;

export function secondsLeft() {
  return Math.max(0, Math.ceil((state.wait.until - Date.now()) / 1000));
}

// A live countdown element: kept current by the one timer.
export function waitCount() {
  return el("b", { class: "wait-count" }, `${secondsLeft()} s`);
}

// The client's hook: requests started or stopped waiting, or the deadline moved.
export function onWait(wait) {
  state.wait = wait;
  renderWaitBox();
  tick();
  document.dispatchEvent(new CustomEvent("eqrisk:wait"));
}

function tick() {
  clearTimeout(timer);
  const left = secondsLeft();
  for (const node of document.querySelectorAll(".wait-count")) node.textContent = `${left} s`;
  if (left > 0) {
    timer = setTimeout(tick, 200);
    return;
  }
  renderWaitBox();
  document.dispatchEvent(new CustomEvent("eqrisk:wait"));
}

function renderWaitBox() {
  const box = $("#wait-box");
  const held = state.wait.waiting > 0 && secondsLeft() > 0;
  box.hidden = !held;
  if (!held) {
    box.replaceChildren();
    delete box.dataset.status;
    return;
  }
  const problem = state.wait.problem;
  // The headers give the count, not the window (a minute, ten seconds...): the 429's body names
  // both ("5/minute"); before one, the count is said as what it is, the window's allowance.
  const limit = (problem && problem.limit) || (state.rate.limit ? `the ${state.rate.limit} requests its rate limit allows per window` : "its rate limit");
  box.dataset.status = problem ? "429" : "wait";
  box.replaceChildren(
    el("p", { class: "problem-title" }, problem ? "Too many requests (429)" : "Waiting for the rate limit"),
    el("p", {},
      problem ? `This key allows ${limit}; ` : `This key has used ${limit}; `,
      "what is on screen completes by itself in ", waitCount(), "."),
  );
}
