// Postlane dashboard: the little that needs a script. Everything works without it.
"use strict";

// Ask before a destructive or fleet-wide action.
document.addEventListener("submit", (event) => {
  const form = event.target;
  const question = form instanceof HTMLFormElement && form.dataset.confirm;
  if (question && !window.confirm(question)) event.preventDefault();
});

// Refresh the lanes panel every few seconds while the page is visible.
function refreshLanes() {
  const panel = document.getElementById("lanes");
  if (!panel || document.visibilityState !== "visible") return;
  fetch(panel.dataset.refresh, { credentials: "same-origin", redirect: "manual" })
    .then((response) => (response.ok ? response.text() : null))
    .then((html) => { if (html !== null) panel.innerHTML = html; })
    .catch(() => {});
}
setInterval(refreshLanes, 5000);
