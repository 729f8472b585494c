// The state every HALO clone keeps in its origin's localStorage, under the clone's STATE_KEY
// (defined by its /state.js with freshState and stateDiff): read, or a fresh one made and saved.
function loadState() {
  const raw = window.localStorage.getItem(STATE_KEY);
  if (raw) {
    try { return JSON.parse(raw); } catch (e) { /* fall through to a fresh state */ }
  }
  const state = freshState("", "0");
  saveState(state);
  return state;
}

function saveState(state) {
  window.localStorage.setItem(STATE_KEY, JSON.stringify(state));
}
