/* jobq dashboard: refresh each page's live part in place, and ask before
 * an action that cannot be undone.
 * The page works without this script; with it, the element #live is
 * replaced every few seconds by a fresh copy that the server renders
 * (GET of the same URL with the header X-Jobq-Partial: 1). One request at
 * a time per tab, none while the tab is hidden. */
(function () {
  "use strict";
  /* An action that cannot be undone asks first: its form's data-confirm,
   * with {state} and {grace} taken from the form's fields. */
  document.addEventListener("submit", function (event) {
    var form = event.target;
    var question = form && form.getAttribute && form.getAttribute("data-confirm");
    if (!question) {
      return;
    }
    question = question.replace(/\{(state|grace)\}/g, function (whole, name) {
      var field = form.elements[name];
      return field ? field.value : whole;
    });
    if (!window.confirm(question)) {
      event.preventDefault();
    }
  });
  var live = document.getElementById("live");
  var status = document.getElementById("live-status");
  var every = parseInt(document.body.getAttribute("data-poll-ms") || "0", 10);
  if (!live || !every || !window.fetch) {
    return;
  }
  var busy = false;
  var failures = 0;

  function show(text, stale) {
    if (status) {
      status.textContent = text;
      status.className = "live-status" + (stale ? " stale" : "");
    }
  }

  function refresh() {
    if (busy || document.hidden) {
      return;
    }
    busy = true;
    fetch(window.location.href, {
      headers: { "X-Jobq-Partial": "1" },
      credentials: "same-origin",
      cache: "no-store",
      redirect: "error"
    }).then(function (response) {
      if (!response.ok) {
        throw new Error("HTTP " + response.status);
      }
      return response.text();
    }).then(function (html) {
      if (html !== live.innerHTML) {
        live.innerHTML = html;  /* rendered and escaped by the server */
      }
      failures = 0;
      show("live", false);
    }, function () {
      failures += 1;
      show("not updating (" + failures + ")", true);
    }).then(function () {
      busy = false;
    });
  }

  show("live", false);
  window.setInterval(refresh, every);
  document.addEventListener("visibilitychange", refresh);
}());
