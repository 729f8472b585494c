// Omnizon (HALO local clone): the shop's state lives in this origin's localStorage, like the
// hosted REAL clones, so every browser context (one per episode) has its own cart and orders.
// /config resets it for a task; /finish reports the difference between the state at /config
// time and now, as REAL's Omnizon does: a deep diff of the app's store, slice by slice,
//   {"initialfinaldiff": {"added": {...}, "deleted": {...}, "updated": {...}}}
// where arrays diff like objects keyed by index, e.g. a first order placed is
//   initialfinaldiff.added.order.orders["0"] = {orderNumber, date, items: [{id, name, price, quantity, ...}], total, ...}
// and a search is initialfinaldiff.updated.filter.searchQuery, the page shown last
// initialfinaldiff.updated.router.location.pathname (e.g. "/confirmation").
"use strict";

const STATE_KEY = "halo-omnizon-state";

function freshApp() {
  return {
    router: {location: {pathname: "/", search: "", hash: ""}},
    filter: {searchQuery: "", searchInputValue: "", category: "", minPrice: null, maxPrice: null, sortBy: "featured"},
    cart: {cartItems: [], buyNowItem: null},
    order: {orders: []},
    user: {
      name: "Alex Morgan",
      email: "alex.morgan@example.com",
      address: {fullName: "Alex Morgan", street: "410 Terry Ave N", city: "Seattle", state: "WA", zip: "98109", country: "United States"},
      paymentMethods: [{id: "card-1", brand: "Visa", cardName: "Alex Morgan", last4: "4242", month: "8", year: "2027"}],
      browsingHistory: [],
    },
  };
}

function freshState(taskId, runId) {
  const app = freshApp();
  return {taskId: taskId || "", runId: runId || "0", nextOrder: 1, initial: JSON.parse(JSON.stringify(app)), current: app};
}

// loadState() and saveState(): /contract.js, shared by every clone.

// ---------------------------------------------------------------- deep diff (deep-object-diff's rules)

const isObject = o => o !== null && typeof o === "object";
const isEmpty = o => isObject(o) && Object.keys(o).length === 0;
const has = (o, k) => Object.prototype.hasOwnProperty.call(o, k);

function addedDiff(lhs, rhs) {
  if (lhs === rhs || !isObject(lhs) || !isObject(rhs)) return {};
  const out = {};
  for (const key of Object.keys(rhs)) {
    if (has(lhs, key)) {
      const d = addedDiff(lhs[key], rhs[key]);
      if (isEmpty(d)) continue;
      out[key] = d;
    } else {
      out[key] = rhs[key];
    }
  }
  return out;
}

// A deleted key is reported with null (JSON has no undefined).
function deletedDiff(lhs, rhs) {
  if (lhs === rhs || !isObject(lhs) || !isObject(rhs)) return {};
  const out = {};
  for (const key of Object.keys(lhs)) {
    if (has(rhs, key)) {
      const d = deletedDiff(lhs[key], rhs[key]);
      if (isEmpty(d)) continue;
      out[key] = d;
    } else {
      out[key] = null;
    }
  }
  return out;
}

function updatedDiff(lhs, rhs) {
  if (lhs === rhs) return {};
  if (!isObject(lhs) || !isObject(rhs)) return rhs;
  const out = {};
  for (const key of Object.keys(rhs)) {
    if (!has(lhs, key)) continue;
    const d = updatedDiff(lhs[key], rhs[key]);
    if (isEmpty(d) && (isEmpty(lhs[key]) || !isEmpty(rhs[key]))) continue;
    out[key] = d;
  }
  return out;
}

function stateDiff(state) {
  return {
    taskId: state.taskId,
    runId: state.runId,
    initialfinaldiff: {
      added: addedDiff(state.initial, state.current),
      deleted: deletedDiff(state.initial, state.current),
      updated: updatedDiff(state.initial, state.current),
    },
  };
}
