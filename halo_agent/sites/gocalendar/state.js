// GoCalendar (HALO local clone): the calendar lives in this origin's localStorage, like the
// hosted REAL clones, so every browser context (one per episode) has its own calendar.
// /config resets it for a task, /finish reports the difference between the calendar at
// /config time and now, in the shape agisdk's GoCalendar eval scripts read:
//   {"differences": {"events": {"added": {id: event}, "updated": {id: event (as it is now)},
//                               "deleted": {id: event (as it was)}}},
//    "eventsDiff": (the same three maps, the shape of the v1 tasks' JMESPath evals),
//    "initialfinaldiff": {"added": {"calendar": {"events": {id: event}}},
//                         "updated": {"calendar": {"events": {id: {changed field: new value}}}},
//                         "deleted": {"calendar": {"events": {id: event}}}},
//    "ui": {...}}
// Times are ISO strings in UTC with milliseconds ("2024-07-17T21:00:00.000Z"); the calendar's
// own time zone is US Pacific whatever the browser's, and "today" is Tuesday, July 16, 2024.
// An all-day event starts at the local midnight of its first day and "ends" at the local
// midnight of its last day (inclusive), so its start and end carry its first and last dates.
"use strict";

const STATE_KEY = "halo-gocalendar-state";
const TIME_ZONE = "America/Los_Angeles";
const TIME_ZONE_LABEL = "(GMT-07:00) Pacific Time - Los Angeles";
const TODAY = "2024-07-16";
const CALENDARS = [
  {name: "Personal", color: "#33b679"},
  {name: "Work", color: "#039be5"},
  {name: "Family", color: "#f4511e"},
];
const REPEATS = [
  {value: "", label: "Does not repeat"},
  {value: "RRULE:FREQ=DAILY", label: "Daily"},
  {value: "RRULE:FREQ=WEEKLY;BYDAY=MO,TU,WE,TH,FR", label: "Every weekday (Monday to Friday)"},
  {value: "RRULE:FREQ=WEEKLY", label: "Weekly"},
  {value: "RRULE:FREQ=MONTHLY", label: "Monthly"},
];
const WEEKDAYS = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"];
const MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
                "September", "October", "November", "December"];

// ------------------------------------------------------------------ dates in the calendar's zone

const _zoneFormat = new Intl.DateTimeFormat("en-US", {
  timeZone: TIME_ZONE, hourCycle: "h23", year: "numeric", month: "2-digit", day: "2-digit",
  hour: "2-digit", minute: "2-digit", second: "2-digit",
});

// {year, month (1-12), day, hour, minute, date: "YYYY-MM-DD", minutes: since local midnight}
function zoneParts(ms) {
  const p = {};
  for (const part of _zoneFormat.formatToParts(new Date(ms))) p[part.type] = part.value;
  const out = {year: +p.year, month: +p.month, day: +p.day, hour: +p.hour % 24, minute: +p.minute};
  out.date = ymd(out.year, out.month, out.day);
  out.minutes = out.hour * 60 + out.minute;
  return out;
}

function ymd(year, month, day) {
  return String(year).padStart(4, "0") + "-" + String(month).padStart(2, "0") + "-" + String(day).padStart(2, "0");
}

function splitDate(date) {
  const [y, m, d] = date.split("-").map(Number);
  return {y, m, d};
}

// The UTC instant (ms) of a wall-clock time in the calendar's zone.
function zonedToUtcMs(date, minutes) {
  const {y, m, d} = splitDate(date);
  const wall = Date.UTC(y, m - 1, d, 0, minutes);
  let guess = wall;
  for (let i = 0; i < 3; i++) {
    const p = zoneParts(guess);
    const shown = Date.UTC(p.year, p.month - 1, p.day, p.hour, p.minute);
    if (shown === wall) break;
    guess += wall - shown;
  }
  return guess;
}

function isoAt(date, minutes) {
  return new Date(zonedToUtcMs(date, minutes)).toISOString();
}

function addDays(date, n) {
  const {y, m, d} = splitDate(date);
  const t = new Date(Date.UTC(y, m - 1, d + n));
  return ymd(t.getUTCFullYear(), t.getUTCMonth() + 1, t.getUTCDate());
}

function weekdayOf(date) {
  const {y, m, d} = splitDate(date);
  return new Date(Date.UTC(y, m - 1, d)).getUTCDay();
}

function daysBetween(a, b) {
  const pa = splitDate(a), pb = splitDate(b);
  return Math.round((Date.UTC(pb.y, pb.m - 1, pb.d) - Date.UTC(pa.y, pa.m - 1, pa.d)) / 86400000);
}

function formatDate(date) {  // "Jul 16, 2024"
  const {y, m, d} = splitDate(date);
  return MONTHS[m - 1].slice(0, 3) + " " + d + ", " + y;
}

function formatLongDate(date) {  // "Tuesday, July 16"
  const {m, d} = splitDate(date);
  return WEEKDAYS[weekdayOf(date)] + ", " + MONTHS[m - 1] + " " + d;
}

function formatTime(minutes) {  // "7:45 PM"
  const h = Math.floor(minutes / 60) % 24, mm = minutes % 60;
  return ((h + 11) % 12 + 1) + ":" + String(mm).padStart(2, "0") + " " + (h < 12 ? "AM" : "PM");
}

// "2024-07-17", "2024/07/17", "07/17/2024", "7/17", "Jul 17, 2024", "Wednesday, July 17", "17 July 2024",
// "today", "tomorrow", "Wednesday" (the next one, today included) -> "YYYY-MM-DD" or null.
function parseDate(text, today) {
  today = today || TODAY;
  let s = String(text || "").trim().toLowerCase().replace(/\s+/g, " ");
  if (!s) return null;
  if (s === "today") return today;
  if (s === "tomorrow") return addDays(today, 1);
  const thisYear = splitDate(today).y;
  let y, m, d, hit;
  if ((hit = s.match(/^(\d{4})[-/.](\d{1,2})[-/.](\d{1,2})$/))) {
    [y, m, d] = [+hit[1], +hit[2], +hit[3]];
  } else if ((hit = s.match(/^(\d{1,2})\/(\d{1,2})(?:\/(\d{2}|\d{4}))?$/))) {
    [m, d, y] = [+hit[1], +hit[2], hit[3] ? +hit[3] : thisYear];
    if (y < 100) y += 2000;
  } else {
    const weekdayIndex = (word) => word.length < 3 ? -1 : WEEKDAYS.findIndex(w => w.toLowerCase().startsWith(word));
    const lead = s.match(/^([a-z]+)\.?(?:, ?| |$)(.*)$/);
    if (lead && weekdayIndex(lead[1]) >= 0) {
      if (!lead[2]) return addDays(today, (weekdayIndex(lead[1]) - weekdayOf(today) + 7) % 7);  // the next one, today included
      s = lead[2];
    }
    const month = (word) => MONTHS.findIndex(name => word.length >= 3 && name.toLowerCase().startsWith(word.replace(/\.$/, ""))) + 1;
    if ((hit = s.match(/^([a-z]+\.?) (\d{1,2})(?:st|nd|rd|th)?(?:,? (\d{4}))?$/))) {
      [m, d, y] = [month(hit[1]), +hit[2], hit[3] ? +hit[3] : thisYear];
    } else if ((hit = s.match(/^(\d{1,2})(?:st|nd|rd|th)? ([a-z]+\.?),?(?: (\d{4}))?$/))) {
      [d, m, y] = [+hit[1], month(hit[2]), hit[3] ? +hit[3] : thisYear];
    } else {
      return null;
    }
  }
  if (!m || m > 12 || !d || d > 31) return null;
  const date = ymd(y, m, d);
  return addDays(date, 0) === date ? date : null;  // 2024-02-30 is no date
}

// "7pm", "7:45 PM", "19:00", "07:45", "noon", "midnight" -> minutes since midnight, or null.
function parseTime(text) {
  const s = String(text || "").trim().toLowerCase().replace(/\s+/g, " ");
  if (s === "noon") return 12 * 60;
  if (s === "midnight") return 0;
  let hit = s.match(/^(\d{1,2})(?:[:.](\d{2}))? ?([ap])\.? ?m?\.?$/);
  if (hit) {
    const h = +hit[1], mm = hit[2] ? +hit[2] : 0;
    if (h < 1 || h > 12 || mm > 59) return null;
    return (h % 12 + (hit[3] === "p" ? 12 : 0)) * 60 + mm;
  }
  hit = s.match(/^(\d{1,2}):(\d{2})$/);
  if (hit && +hit[1] < 24 && +hit[2] < 60) return +hit[1] * 60 + +hit[2];
  return null;
}

// ------------------------------------------------------------------ the calendar's data

// A Google Meet style code ("abc-defg-hij") for an event id: fixed per id, so runs compare.
function meetingIdFor(id) {
  let h = 2166136261;
  for (const ch of "gocalendar:" + id) h = Math.imul(h ^ ch.charCodeAt(0), 16777619) >>> 0;
  let code = "";
  for (let i = 0; i < 10; i++) {
    code += String.fromCharCode(97 + (h % 26));
    h = Math.imul(h ^ (i + 1), 2654435761) >>> 0;
  }
  return code.slice(0, 3) + "-" + code.slice(3, 7) + "-" + code.slice(7);
}

function makeEvent(id, fields) {
  const calendar = fields.calendar || "Personal";
  return {
    id, title: fields.title || "", start: fields.start, end: fields.end, allDay: !!fields.allDay,
    location: fields.location || "", description: fields.description || "", calendar,
    color: (CALENDARS.find(c => c.name === calendar) || CALENDARS[0]).color,
    guests: fields.guests || [], hasMeeting: !!fields.hasMeeting, meetingId: meetingIdFor(id),
    recurrence: fields.recurrence || "",
  };
}

function seedEvents() {
  // [title, date, start "HH:MM", end "HH:MM", calendar, location, description, extra]
  const rows = [
    ["Team Standup Meeting", "2024-07-15", "09:00", "09:30", "Work", "Zoom", "Daily updates from the team.", {hasMeeting: true}],
    ["Project Sync", "2024-07-15", "14:00", "15:00", "Work", "Conference Room B", "Weekly sync on the Falcon project."],
    ["Morning Walk", "2024-07-16", "07:00", "07:45", "Personal", "Golden Gate Park", ""],
    ["Client Call", "2024-07-16", "10:00", "11:00", "Work", "", "Quarterly review with Acme Corp.", {hasMeeting: true}],
    ["Lunch with Boss", "2024-07-16", "12:00", "13:00", "Work", "Cafe Rosa", ""],
    ["Team Brainstorming Session", "2024-07-16", "15:00", "16:00", "Work", "Conference Room A", ""],
    ["Team Workshop", "2024-07-17", "09:00", "11:00", "Work", "Conference Room A", "Hands-on session on the new tooling."],
    ["Project Sync", "2024-07-17", "14:00", "15:00", "Work", "Conference Room B", "Weekly sync on the Falcon project."],
    ["Dinner with Friends", "2024-07-17", "19:00", "21:00", "Personal", "Nopa, 560 Divisadero St", "With Maya, Leo and Sam."],
    ["Reading Time", "2024-07-17", "22:00", "23:00", "Personal", "", "Finish the book club novel."],
    ["Morning Coffee with Sister", "2024-07-18", "09:00", "10:00", "Family", "Blue Bottle Coffee", ""],
    ["Team Check-In", "2024-07-18", "11:00", "11:30", "Work", "Conference Room A", "", {hasMeeting: true}],
    ["Customer Feedback Session", "2024-07-18", "15:00", "16:00", "Work", "Conference Room B", ""],
    ["Breakfast Meeting with Client", "2024-07-19", "10:00", "11:00", "Work", "The Grove Cafe", ""],
    ["Lunch with Marketing Team", "2024-07-19", "12:30", "13:30", "Work", "Cafeteria", ""],
    ["Team Progress Check", "2024-07-19", "14:00", "14:30", "Work", "Conference Room A", ""],
    ["Coffee with Alex", "2024-07-19", "16:00", "16:30", "Personal", "Sightglass Coffee", ""],
    ["Dinner with Parents", "2024-07-20", "18:30", "20:30", "Family", "Mom and Dad's place", ""],
    ["Client Presentation", "2024-07-22", "11:00", "12:00", "Work", "Conference Room A", "Present the Q3 roadmap."],
    ["Team Collaboration Work", "2024-07-23", "13:00", "15:00", "Work", "Conference Room B", ""],
  ];
  const minutes = (hhmm) => +hhmm.slice(0, 2) * 60 + +hhmm.slice(3);
  return rows.map(([title, date, from, to, calendar, location, description, extra], i) =>
    makeEvent("ev-" + (i + 1), Object.assign({
      title, calendar, location, description, start: isoAt(date, minutes(from)), end: isoAt(date, minutes(to)),
    }, extra || {})));
}

function freshState(taskId, runId) {
  const events = seedEvents();
  return {
    taskId: taskId || "", runId: runId || "0", nextId: 101,
    initial: {events: JSON.parse(JSON.stringify(events))},
    current: {events},
    // What the person did on the way (kept for /finish): whether the event editor was ever
    // opened, which events' details were opened, the form being edited, the last message.
    ui: {snackbar: "", editorOpened: false, openedEvents: [], draft: null},
  };
}

// loadState() and saveState(): /contract.js, shared by every clone.

function stateDiff(state) {
  const before = new Map(state.initial.events.map(e => [e.id, e]));
  const after = new Map(state.current.events.map(e => [e.id, e]));
  const added = {}, updated = {}, deleted = {}, changed = {};
  for (const [id, e] of after) {
    if (!before.has(id)) { added[id] = e; continue; }
    const old = before.get(id);
    const changes = {};
    for (const key of Object.keys(e)) {
      if (JSON.stringify(e[key]) !== JSON.stringify(old[key])) changes[key] = e[key];
    }
    if (Object.keys(changes).length) { updated[id] = e; changed[id] = changes; }
  }
  for (const [id, e] of before) {
    if (!after.has(id)) deleted[id] = e;
  }
  return {
    taskId: state.taskId,
    runId: state.runId,
    ui: state.ui,
    differences: {events: {added, updated, deleted}},
    eventsDiff: {added, updated, deleted},
    initialfinaldiff: {
      added: {calendar: {events: added}},
      updated: {calendar: {events: changed}},
      deleted: {calendar: {events: deleted}},
    },
  };
}
