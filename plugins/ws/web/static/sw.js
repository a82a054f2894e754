// The page's service worker (docs/NOTIFICATIONS.md, "Web Push"): it shows
// the host's push notifications and, on a click, opens the session or
// terminal they are about. It handles no fetch: the page works as before.
"use strict";

const TITLES = {
  "permission.requested": "An agent waits for your answer",
  "run.completed": "An answer is ready",
  "run.failed": "A run failed",
  "pty.exited": "A terminal exited",
  "test": "tether: a test notification",
};

self.addEventListener("push", (e) => {
  let ev = {};
  try {
    ev = e.data ? e.data.json() : {};
  } catch {
    ev = {};
  }
  const title = TITLES[ev.type] || "tether";
  const body = [ev.title, ev.tool, ev.reason, ev.by && "by " + ev.by].filter(Boolean).join(" — ");
  e.waitUntil(self.registration.showNotification(title, {
    body,
    tag: ev.id || undefined, // a retried push replaces, never doubles
    requireInteraction: ev.type === "permission.requested",
    data: { link: ev.link || "" },
  }));
});

self.addEventListener("notificationclick", (e) => {
  e.notification.close();
  let url = new URL("./", self.registration.scope);
  try {
    const link = new URL((e.notification.data && e.notification.data.link) || "./", self.registration.scope);
    if (link.protocol === "https:" || link.protocol === "http:") url = link;
  } catch {
    // not a URL: the page
  }
  e.waitUntil(self.clients.openWindow(url.href));
});
