// GoMail (HALO local clone): the app state lives in this origin's localStorage, like the
// hosted REAL clones, so every browser context (one per episode) has its own mailbox.
// /config resets it for a task, /finish reports the difference between the state at
// /config time and now, in the shape agisdk's evaluators read:
//   {"differences": {"emails": {"added": [...], "deleted": [...], "updated": [...]}},
//    "initialfinaldiff": {"added": {"email": {"emails": {id: email}}}, "deleted": ..., "updated": ...}}
"use strict";

const STATE_KEY = "halo-gomail-state";
const ME = "me@gomail.example.com";

function seedEmails() {
  const email = (id, fromName, from, subject, content, date, extra) => Object.assign({
    id, fromName, from, to: [ME], cc: [], bcc: [], subject, content, date,
    isRead: false, starred: false, sent: false, draft: false, spam: false, trash: false, archived: false,
    labels: ["inbox"],
  }, extra || {});
  return [
    email("e1", "Alice Chen", "alice.chen@example.com", "Project kickoff",
          "Hi! The kickoff for the Falcon project is on Monday at 10 AM.", "2024-05-06T09:12:00Z"),
    email("e2", "Uber Receipts", "noreply@uber.com", "Your Friday evening trip with Uber",
          "Thanks for riding with Uber. Total: $18.40.", "2024-05-04T21:40:00Z", {labels: ["inbox", "updates"]}),
    email("e3", "Brian King", "brian.king@example.com", "Team meeting",
          "We met today and went through the roadmap. I took notes during the meeting.", "2024-05-03T16:05:00Z"),
    email("e4", "Amazon", "shipment-tracking@amazon.com", "Your order has shipped",
          "Your package with 2 items is on the way.", "2024-05-02T08:30:00Z", {isRead: true}),
    email("e5", "Notifications", "notifications@calendar.example.com", "Reminder: dentist appointment",
          "This is a reminder of your appointment on Thursday.", "2024-05-01T07:00:00Z", {starred: true}),
  ];
}

function freshState(taskId, runId) {
  const emails = seedEmails();
  return {
    taskId: taskId || "", runId: runId || "0", nextId: 1,
    initial: {emails: JSON.parse(JSON.stringify(emails))},
    current: {emails},
    ui: {snackbar: ""},
  };
}

// loadState() and saveState(): /contract.js, shared by every clone.

function stateDiff(state) {
  const before = new Map(state.initial.emails.map(e => [e.id, e]));
  const after = new Map(state.current.emails.map(e => [e.id, e]));
  const added = [], deleted = [], updated = [];
  const addedById = {}, deletedById = {}, updatedById = {};
  for (const [id, e] of after) {
    if (!before.has(id)) { added.push(e); addedById[id] = e; continue; }
    const old = before.get(id);
    const changes = {};
    for (const key of Object.keys(e)) {
      if (JSON.stringify(e[key]) !== JSON.stringify(old[key])) changes[key] = e[key];
    }
    if (Object.keys(changes).length) { updated.push(e); updatedById[id] = changes; }
  }
  for (const [id, e] of before) {
    if (!after.has(id)) { deleted.push(e); deletedById[id] = e; }
  }
  return {
    taskId: state.taskId,
    runId: state.runId,
    ui: state.ui,
    differences: {emails: {added, deleted, updated}},
    initialfinaldiff: {
      added: {email: {emails: addedById}},
      deleted: {email: {emails: deletedById}},
      updated: {email: {emails: updatedById}},
    },
  };
}
