// Omnizon (HALO local clone): one page, client-side routing (history.pushState + popstate).
// Pages: / (home), /search?q=..&category=..&min=..&max=..&sort=.., /product/<id>, /cart,
// /checkout, /confirmation, /orders. Every change of the shop's store goes through update(),
// which re-reads localStorage first, so tabs and the /finish page always agree.
"use strict";

const BY_ID = new Map(CATALOG.map(p => [p.id, p]));
const MAX_QUANTITY = 30;
const TAX_RATE = 0.0825;
const DELIVERY_OPTIONS = [
  {id: "standard", label: "Standard Shipping", cost: 0, days: 5},
  {id: "two-day", label: "Two-Day Shipping", cost: 5.99, days: 2},
  {id: "one-day", label: "One-Day Shipping", cost: 9.99, days: 1},
];

let state = loadState();
// What the checkout form holds until the order is placed (not part of the store, like a form's own state).
let checkoutDraft = null;

// ---------------------------------------------------------------- helpers

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "onclick") node.addEventListener("click", v);
    else if (k === "onchange") node.addEventListener("change", v);
    else if (k === "oninput") node.addEventListener("input", v);
    else if (k === "onsubmit") node.addEventListener("submit", v);
    else if (k === "className") node.className = v;
    else if (k === "html") node.innerHTML = v;
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined && child !== false) node.append(child);
  }
  return node;
}

const money = n => "$" + n.toFixed(2);
const round2 = n => Math.round(n * 100) / 100;
const app = () => state.current;

function update(mutate) {
  state = loadState();
  mutate(state.current);
  saveState(state);
}

function stars(p) {
  return el("div", {className: "rating"}, `${p.rating.toFixed(1)} out of 5 stars`, el("span", {className: "muted"}, ` (${p.reviews.toLocaleString("en-US")})`));
}

function thumb(p, size) {
  const category = CATEGORIES.find(c => c.name === p.category) || {color: "#888"};
  const initials = p.brand.replace(/[^A-Za-z0-9 ]/g, "").split(" ").map(w => w[0]).join("").slice(0, 3).toUpperCase();
  const svg = `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 160 160" width="${size}" height="${size}" aria-hidden="true">
    <rect width="160" height="160" rx="12" fill="#f7f7f7"/><circle cx="80" cy="70" r="44" fill="${category.color}"/>
    <text x="80" y="80" font-size="28" font-family="Arial" fill="white" text-anchor="middle">${initials}</text>
    <text x="80" y="142" font-size="13" font-family="Arial" fill="#555" text-anchor="middle">${p.category}</text></svg>`;
  return el("span", {className: "thumb", "aria-hidden": "true", html: svg});
}

function productLink(p) {
  return el("a", {href: "/product/" + p.id}, p.name);
}

function showStatus(...children) {
  const box = document.getElementById("status-message");
  box.replaceChildren(...children);
  box.classList.add("shown");
  clearTimeout(showStatus.timer);
  showStatus.timer = setTimeout(() => box.classList.remove("shown"), 8000);
}

function cartCount() {
  return app().cart.cartItems.reduce((n, item) => n + item.quantity, 0);
}

function quantitySelect(id, label, value, onchange) {
  const select = el("select", {id, "aria-label": label, onchange});
  for (let q = 1; q <= MAX_QUANTITY; q++) select.append(el("option", {value: String(q), selected: q === value}, String(q)));
  return select;
}

function lineItem(p, quantity) {
  return {id: p.id, name: p.name, brand: p.brand, category: p.category, price: p.price, quantity};
}

function addToCart(p, quantity) {
  update(s => {
    const line = s.cart.cartItems.find(item => item.id === p.id);
    if (line) line.quantity = Math.min(MAX_QUANTITY, line.quantity + quantity);
    else s.cart.cartItems.push(lineItem(p, quantity));
  });
  renderHeader();
  const n = cartCount();
  showStatus(el("strong", {}, "Added to Cart"), el("p", {}, `${quantity} x ${p.name}`),
             el("p", {}, `Cart subtotal (${n} item${n === 1 ? "" : "s"}): ${money(cartSubtotal())}`),
             el("a", {href: "/cart"}, "Go to Cart"), " ", el("a", {href: "/checkout", "data-from": "cart"}, "Proceed to checkout"));
}

function cartSubtotal() {
  return round2(app().cart.cartItems.reduce((sum, item) => sum + item.price * item.quantity, 0));
}

function deliveryDate(days) {
  const d = new Date();
  d.setDate(d.getDate() + days);
  return d.toLocaleDateString("en-US", {weekday: "long", month: "short", day: "numeric"});
}

// ---------------------------------------------------------------- routing

function navigate(url) {
  history.pushState({}, "", url);
  route();
}

// A new location: the store's router follows it, the page starts at the top.
function route() {
  const {pathname, search} = window.location;
  if (app().router.location.pathname !== pathname || app().router.location.search !== search) {
    update(s => { s.router.location = {pathname, search, hash: ""}; });
  }
  window.scrollTo(0, 0);
  document.getElementById("status-message").classList.remove("shown");
  render();
}

// The current location's page, drawn from the store.
function render() {
  const {pathname, search} = window.location;
  renderHeader();
  const content = document.getElementById("content");
  content.replaceChildren();
  const product = pathname.match(/^\/product\/([^/]+)\/?$/);
  if (pathname === "/" || pathname === "") renderHome(content);
  else if (pathname === "/search" || pathname === "/s") renderSearch(content, new URLSearchParams(search));
  else if (product) renderProduct(content, product[1]);
  else if (pathname === "/cart") renderCart(content);
  else if (pathname === "/checkout") renderCheckout(content);
  else if (pathname === "/confirmation") renderConfirmation(content);
  else if (pathname === "/orders") renderOrders(content);
  else renderNotFound(content);
}

document.addEventListener("click", ev => {
  const a = ev.target.closest("a[href]");
  if (!a || ev.defaultPrevented || ev.button !== 0 || ev.metaKey || ev.ctrlKey || ev.shiftKey || ev.altKey) return;
  const url = new URL(a.href, window.location.href);
  if (url.origin !== window.location.origin || a.target) return;
  ev.preventDefault();
  if (url.pathname === "/checkout" && a.dataset.from === "cart") update(s => { s.cart.buyNowItem = null; });
  navigate(url.pathname + url.search);
});
window.addEventListener("popstate", route);

// ---------------------------------------------------------------- header and search

function renderHeader() {
  document.getElementById("cart-count").textContent = String(cartCount());
  const input = document.getElementById("search-input");
  if (document.activeElement !== input) input.value = app().filter.searchInputValue;
  document.getElementById("search-department").value = app().filter.category;
}

function setUpHeader() {
  const department = document.getElementById("search-department");
  department.append(el("option", {value: ""}, "All Departments"));
  const nav = document.getElementById("departments");
  for (const c of CATEGORIES) {
    department.append(el("option", {value: c.name}, c.name));
    nav.append(el("a", {href: "/search?category=" + encodeURIComponent(c.name)}, c.name));
  }
  const input = document.getElementById("search-input");
  input.addEventListener("input", () => update(s => { s.filter.searchInputValue = input.value; }));
  document.getElementById("search-form").addEventListener("submit", ev => {
    ev.preventDefault();
    const q = input.value.trim();
    const params = new URLSearchParams();
    if (q) params.set("q", q);
    if (department.value) params.set("category", department.value);
    update(s => { s.filter.searchInputValue = q; });
    input.blur();
    navigate("/search?" + params.toString());
  });
}

function stem(word) {
  if (word.length > 4 && word.endsWith("es") && !word.endsWith("ses")) return word.slice(0, -1);
  if (word.length > 3 && word.endsWith("s") && !word.endsWith("ss")) return word.slice(0, -1);
  return word;
}

function matches(p, query) {
  const words = query.toLowerCase().split(/[^a-z0-9]+/).filter(Boolean).map(stem);
  const haystack = [p.name, p.brand, p.category, p.keywords].join(" ").toLowerCase();
  return words.every(w => haystack.includes(w));
}

function searchResults(filter) {
  let list = CATALOG.filter(p => (!filter.searchQuery || matches(p, filter.searchQuery))
    && (!filter.category || p.category === filter.category)
    && (filter.minPrice === null || p.price >= filter.minPrice)
    && (filter.maxPrice === null || p.price <= filter.maxPrice));
  const sorters = {
    "price-asc": (a, b) => a.price - b.price,
    "price-desc": (a, b) => b.price - a.price,
    "rating": (a, b) => b.rating - a.rating,
  };
  if (sorters[filter.sortBy]) list = list.slice().sort(sorters[filter.sortBy]);
  return list;
}

function priceParam(value) {
  if (value === null || value === "") return null;
  const n = Number(value);
  return Number.isFinite(n) ? n : null;
}

// ---------------------------------------------------------------- pages

function renderHome(content) {
  document.title = "Omnizon.com. Spend less. Smile more.";
  content.append(el("section", {className: "hero"},
    el("h1", {}, "Welcome to Omnizon"),
    el("p", {}, "Everyday low prices on electronics, gaming, kitchen, furniture and more. FREE standard shipping on every order.")));
  const grid = el("div", {className: "grid", role: "list", "aria-label": "Shop by category"});
  for (const c of CATEGORIES) {
    const first = CATALOG.find(p => p.category === c.name);
    grid.append(el("div", {className: "card", role: "listitem"},
      el("h3", {}, c.name), thumb(first, 140),
      el("p", {}, el("a", {href: "/search?category=" + encodeURIComponent(c.name)}, "Shop " + c.name))));
  }
  content.append(el("h2", {}, "Shop by category"), grid);
  const deals = ["1", "16", "212", "114", "159", "170", "15", "220"].map(id => BY_ID.get(id));
  const row = el("div", {className: "grid", role: "list", "aria-label": "Today's deals"});
  for (const p of deals) {
    row.append(el("div", {className: "card", role: "listitem"}, thumb(p, 120), el("p", {}, productLink(p)),
      el("div", {className: "price"}, money(p.price))));
  }
  content.append(el("h2", {}, "Today's deals"), row);
}

function renderSearch(content, params) {
  const filter = {
    searchQuery: (params.get("q") || "").trim(),
    category: params.get("category") || "",
    minPrice: priceParam(params.get("min")),
    maxPrice: priceParam(params.get("max")),
    sortBy: params.get("sort") || "featured",
  };
  const f = app().filter;
  if (f.searchQuery !== filter.searchQuery || f.category !== filter.category || f.minPrice !== filter.minPrice
      || f.maxPrice !== filter.maxPrice || f.sortBy !== filter.sortBy) {
    // A search reached by its URL (a link, back/forward, typed) shows its words in the search box too.
    const typed = f.searchQuery !== filter.searchQuery ? {searchInputValue: filter.searchQuery} : {};
    update(s => Object.assign(s.filter, filter, typed));
  }
  renderHeader();
  const results = searchResults(app().filter);
  const what = filter.searchQuery ? `"${filter.searchQuery}"` : (filter.category || "all products");
  document.title = "Omnizon.com : " + (filter.searchQuery || filter.category || "Search");

  const withParams = changes => {
    const next = new URLSearchParams(params);
    for (const [k, v] of Object.entries(changes)) {
      if (v === null || v === "") next.delete(k); else next.set(k, v);
    }
    return "/search?" + next.toString();
  };

  const sidebar = el("aside", {className: "sidebar panel", "aria-label": "Filters"});
  const departments = el("ul", {});
  for (const c of CATEGORIES) departments.append(el("li", {}, el("a", {href: withParams({category: c.name})}, c.name)));
  if (filter.category) departments.append(el("li", {}, el("a", {href: withParams({category: null})}, "Any Department")));
  const min = el("input", {id: "min-price", type: "number", min: "0", "aria-label": "Min price", placeholder: "Min",
                           value: filter.minPrice === null ? "" : String(filter.minPrice)});
  const max = el("input", {id: "max-price", type: "number", min: "0", "aria-label": "Max price", placeholder: "Max",
                           value: filter.maxPrice === null ? "" : String(filter.maxPrice)});
  const priceForm = el("form", {"aria-label": "Price range", onsubmit: ev => {
    ev.preventDefault();
    navigate(withParams({min: min.value.trim(), max: max.value.trim()}));
  }}, "$", min, " to $", max, " ", el("button", {type: "submit", className: "btn plain"}, "Go"));
  sidebar.append(el("h3", {}, "Department"), departments, el("h3", {}, "Price"), priceForm);
  if (filter.minPrice !== null || filter.maxPrice !== null) {
    sidebar.append(el("p", {}, el("a", {href: withParams({min: null, max: null})}, "Clear price filter")));
  }

  const sort = el("select", {id: "sort-by", "aria-label": "Sort by", onchange: ev => navigate(withParams({sort: ev.target.value === "featured" ? null : ev.target.value}))},
    ...[["featured", "Featured"], ["price-asc", "Price: Low to High"], ["price-desc", "Price: High to Low"], ["rating", "Avg. Customer Review"]]
      .map(([v, label]) => el("option", {value: v, selected: v === filter.sortBy}, label)));
  const list = el("div", {role: "list", "aria-label": "Search results"});
  for (const p of results) {
    list.append(el("div", {className: "result", role: "listitem"},
      el("a", {href: "/product/" + p.id, tabindex: "-1", "aria-hidden": "true"}, thumb(p, 160)),
      el("div", {},
        el("h2", {}, productLink(p)),
        stars(p),
        el("div", {className: "price"}, money(p.price)),
        el("div", {className: "muted"}, "FREE delivery " + deliveryDate(5)),
        el("p", {}, el("button", {type: "button", className: "btn", "aria-label": "Add to Cart: " + p.name,
                                  onclick: () => addToCart(p, 1)}, "Add to Cart")))));
  }
  const main = el("section", {"aria-label": "Results"},
    el("div", {className: "panel"},
      el("h1", {style: "font-size: 16px; margin: 0"}, `${results.length} result${results.length === 1 ? "" : "s"} for ${what}`),
      el("label", {}, "Sort by: ", sort)));
  if (results.length) main.append(list);
  else main.append(el("div", {className: "panel"}, el("p", {}, `No results for ${what}.`),
                      el("p", {}, "Try checking your spelling or use more general terms.")));
  content.append(el("div", {className: "results"}, sidebar, main));
}

function renderProduct(content, id) {
  const p = BY_ID.get(id);
  if (!p) { renderNotFound(content); return; }
  if (!app().user.browsingHistory.includes(p.id)) update(s => { s.user.browsingHistory.push(p.id); });
  document.title = "Omnizon.com: " + p.name;
  const qty = quantitySelect("quantity", "Quantity", 1);
  const specs = el("table", {className: "specs"}, el("tbody", {},
    ...Object.entries(Object.assign({Brand: p.brand}, p.specs)).map(([k, v]) => el("tr", {}, el("th", {scope: "row"}, k), el("td", {}, v)))));
  content.append(
    el("p", {className: "muted"}, el("a", {href: "/search?category=" + encodeURIComponent(p.category)}, p.category)),
    el("div", {className: "product"},
      thumb(p, 340),
      el("div", {},
        el("h1", {}, p.name),
        el("a", {href: "/search?q=" + encodeURIComponent(p.brand)}, "Visit the " + p.brand + " Store"),
        stars(p),
        el("div", {className: "price"}, money(p.price)),
        el("h2", {style: "font-size: 16px"}, "About this item"),
        el("ul", {}, ...p.features.map(f => el("li", {}, f))),
        el("h2", {style: "font-size: 16px"}, "Product information"),
        specs),
      el("div", {className: "buybox", role: "region", "aria-label": "Buy box"},
        el("div", {className: "price"}, money(p.price)),
        el("p", {className: "muted"}, "FREE delivery " + deliveryDate(5)),
        el("p", {className: "instock"}, "In Stock"),
        el("label", {}, "Quantity: ", qty),
        el("button", {type: "button", className: "btn", onclick: () => addToCart(p, Number(qty.value))}, "Add to Cart"),
        el("button", {type: "button", className: "btn buy", onclick: () => {
          update(s => { s.cart.buyNowItem = lineItem(p, Number(qty.value)); });
          navigate("/checkout");
        }}, "Buy Now"),
        el("p", {className: "muted"}, "Ships from and sold by Omnizon.com"))));
}

function renderCart(content) {
  document.title = "Omnizon.com Shopping Cart";
  const items = app().cart.cartItems;
  const panel = el("section", {className: "panel", "aria-label": "Shopping Cart"}, el("h1", {}, "Shopping Cart"));
  if (!items.length) {
    panel.append(el("p", {}, "Your Omnizon Cart is empty."), el("a", {href: "/"}, "Continue shopping"));
    content.append(panel);
    return;
  }
  for (const item of items) {
    const p = BY_ID.get(item.id);
    panel.append(el("div", {className: "cart-line"},
      thumb(p, 120),
      el("div", {},
        el("h2", {style: "font-size: 17px; font-weight: normal; margin: 0"}, productLink(p)),
        el("p", {className: "instock"}, "In Stock"),
        el("label", {}, "Qty: ", quantitySelect("qty-" + item.id, "Quantity for " + item.name, item.quantity, ev => {
          update(s => { s.cart.cartItems.find(x => x.id === item.id).quantity = Number(ev.target.value); });
          render();
        })),
        " ",
        el("button", {type: "button", className: "btn plain", "aria-label": "Delete " + item.name, onclick: () => {
          update(s => { s.cart.cartItems = s.cart.cartItems.filter(x => x.id !== item.id); });
          render();
        }}, "Delete")),
      el("div", {className: "price", style: "text-align: right"}, money(item.price))));
  }
  const n = cartCount();
  const subtotal = `Subtotal (${n} item${n === 1 ? "" : "s"}): ${money(cartSubtotal())}`;
  panel.append(el("p", {style: "text-align: right; font-size: 18px"}, subtotal));
  content.append(el("div", {className: "checkout"}, panel,
    el("aside", {className: "summary"}, el("p", {}, subtotal),
      el("button", {type: "button", className: "btn", onclick: () => {
        update(s => { s.cart.buyNowItem = null; });
        navigate("/checkout");
      }}, "Proceed to checkout"))));
}

function checkoutItems() {
  const c = app().cart;
  return c.buyNowItem ? [c.buyNowItem] : c.cartItems;
}

function newDraft() {
  const u = app().user;
  return {address: Object.assign({}, u.address), editingAddress: false, payment: u.paymentMethods[0].id,
          card: {cardName: "", cardNumber: "", month: "1", year: "2027", securityCode: ""}, delivery: "standard", problem: ""};
}

function renderCheckout(content) {
  document.title = "Omnizon.com Checkout";
  const items = checkoutItems();
  if (!items.length) {
    content.append(el("section", {className: "panel"}, el("h1", {}, "Checkout"),
      el("p", {}, "Your Omnizon Cart is empty."), el("a", {href: "/"}, "Continue shopping")));
    return;
  }
  if (!checkoutDraft) checkoutDraft = newDraft();
  const d = checkoutDraft;
  const rerender = () => render();

  // 1. Shipping address
  const a = d.address;
  const address = el("section", {"aria-label": "Shipping address"}, el("h2", {}, "1. Shipping address"));
  if (!d.editingAddress) {
    address.append(el("p", {}, `${a.fullName}, ${a.street}, ${a.city}, ${a.state} ${a.zip}`),
      el("button", {type: "button", className: "btn plain", onclick: () => { d.editingAddress = true; rerender(); }}, "Change address"));
  } else {
    const field = (key, label) => el("label", {}, label + " ", el("input", {type: "text", "aria-label": label, value: a[key], "data-key": key}));
    const form = el("form", {"aria-label": "Edit address", onsubmit: ev => {
      ev.preventDefault();
      for (const input of form.querySelectorAll("input[data-key]")) a[input.dataset.key] = input.value.trim();
      d.editingAddress = false;
      rerender();
    }}, field("fullName", "Full name"), field("street", "Street address"), field("city", "City"), field("state", "State"),
       field("zip", "ZIP code"), el("button", {type: "submit", className: "btn"}, "Use this address"));
    address.append(form);
  }

  // 2. Payment method
  const payment = el("section", {"aria-label": "Payment method"}, el("h2", {}, "2. Payment method"));
  const radio = (name, value, label, checked, onchange) =>
    el("label", {}, el("input", {type: "radio", name, value, checked, onchange}), " " + label);
  for (const card of app().user.paymentMethods) {
    payment.append(radio("payment", card.id, `${card.brand} ending in ${card.last4}`, d.payment === card.id, () => { d.payment = card.id; rerender(); }));
  }
  payment.append(radio("payment", "new-card", "Add a credit or debit card", d.payment === "new-card", () => { d.payment = "new-card"; rerender(); }));
  if (d.payment === "new-card") {
    const c = d.card;
    const text = (key, label) => el("label", {}, label + " ", el("input", {type: "text", "aria-label": label, value: c[key],
                                                                          oninput: ev => { c[key] = ev.target.value; }}));
    const month = el("select", {"aria-label": "Expiration month", onchange: ev => { c.month = ev.target.value; }},
      ...Array.from({length: 12}, (_, i) => el("option", {value: String(i + 1), selected: String(i + 1) === c.month}, String(i + 1).padStart(2, "0"))));
    const year = el("select", {"aria-label": "Expiration year", onchange: ev => { c.year = ev.target.value; }},
      ...Array.from({length: 11}, (_, i) => String(2025 + i)).map(y => el("option", {value: y, selected: y === c.year}, y)));
    payment.append(el("div", {role: "group", "aria-label": "New card"}, text("cardName", "Name on card"), text("cardNumber", "Card number"),
      el("label", {}, "Expiration date ", month, " ", year), text("securityCode", "Security code")));
  }

  // 3. Delivery
  const delivery = el("section", {"aria-label": "Delivery option"}, el("h2", {}, "3. Choose a delivery option"));
  for (const o of DELIVERY_OPTIONS) {
    const price = o.cost ? money(o.cost) : "FREE";
    delivery.append(radio("delivery", o.id, `${deliveryDate(o.days)}: ${price} ${o.label}`, d.delivery === o.id, () => { d.delivery = o.id; rerender(); }));
  }

  // 4. Items
  const review = el("section", {"aria-label": "Review items"}, el("h2", {}, "4. Review items"));
  for (const item of items) {
    review.append(el("div", {className: "cart-line"}, thumb(BY_ID.get(item.id), 100),
      el("div", {}, el("strong", {}, item.name), el("div", {className: "price"}, money(item.price)),
        el("label", {}, "Qty: ", quantitySelect("checkout-qty-" + item.id, "Quantity for " + item.name, item.quantity, ev => {
          const q = Number(ev.target.value);
          update(s => {
            if (s.cart.buyNowItem) s.cart.buyNowItem.quantity = q;
            else s.cart.cartItems.find(x => x.id === item.id).quantity = q;
          });
          rerender();
        }))), el("div", {})));
  }

  const totals = orderTotals(items, d.delivery);
  const summary = el("aside", {className: "summary", "aria-label": "Order summary"},
    el("button", {type: "button", className: "btn buy", style: "width: 100%", onclick: placeOrder}, "Place your order"),
    d.problem ? el("div", {className: "alert", role: "alert"}, d.problem) : null,
    el("h2", {style: "font-size: 17px"}, "Order Summary"),
    el("div", {className: "row"}, el("span", {}, `Items (${totals.count}):`), el("span", {}, money(totals.subtotal))),
    el("div", {className: "row"}, el("span", {}, "Shipping & handling:"), el("span", {}, money(totals.shipping))),
    el("div", {className: "row"}, el("span", {}, "Estimated tax:"), el("span", {}, money(totals.tax))),
    el("div", {className: "row total"}, el("span", {}, "Order total:"), el("span", {}, money(totals.total))));
  content.append(el("h1", {}, "Checkout (" + totals.count + " item" + (totals.count === 1 ? "" : "s") + ")"),
    el("div", {className: "checkout"}, el("div", {}, address, payment, delivery, review), summary));
}

function orderTotals(items, deliveryId) {
  const option = DELIVERY_OPTIONS.find(o => o.id === deliveryId) || DELIVERY_OPTIONS[0];
  const subtotal = round2(items.reduce((sum, item) => sum + item.price * item.quantity, 0));
  const tax = round2(subtotal * TAX_RATE);
  return {count: items.reduce((n, item) => n + item.quantity, 0), subtotal, shipping: option.cost, tax,
          total: round2(subtotal + option.cost + tax), option};
}

function paymentFromDraft(d) {
  if (d.payment !== "new-card") {
    const card = app().user.paymentMethods.find(c => c.id === d.payment);
    return {problem: "", method: {type: "card", brand: card.brand, cardName: card.cardName, last4: card.last4, month: card.month, year: card.year}};
  }
  const c = d.card;
  const digits = c.cardNumber.replace(/[\s-]/g, "");
  if (!c.cardName.trim()) return {problem: "Enter the name on the card."};
  if (!/^\d{13,19}$/.test(digits)) return {problem: "The card number is not valid."};
  if (!/^\d{3,4}$/.test(c.securityCode.trim())) return {problem: "Enter the card's security code."};
  return {problem: "", method: {type: "card", brand: "Card", cardName: c.cardName.trim(), last4: digits.slice(-4), month: c.month, year: c.year}};
}

function placeOrder() {
  const d = checkoutDraft;
  const items = checkoutItems();
  const payment = paymentFromDraft(d);
  if (payment.problem) { d.problem = payment.problem; render(); return; }
  const totals = orderTotals(items, d.delivery);
  update(s => {
    const n = state.nextOrder++;  // the store's root, just re-read by update()
    const order = {
      orderNumber: `112-${String(4830000 + n * 7919).padStart(7, "0")}-${String(1000000 + n * 104729 % 8999999).padStart(7, "0")}`,
      date: new Date().toISOString(),
      items: items.map(item => Object.assign({}, item)),
      itemCount: totals.count,
      subtotal: totals.subtotal,
      shippingCost: totals.shipping,
      tax: totals.tax,
      total: totals.total,
      shippingAddress: Object.assign({}, d.address),
      paymentMethod: payment.method,
      delivery: {option: totals.option.id, label: totals.option.label, date: deliveryDate(totals.option.days)},
      status: "Ordered",
    };
    s.order.orders.push(order);
    if (s.cart.buyNowItem) s.cart.buyNowItem = null;
    else s.cart.cartItems = [];
  });
  checkoutDraft = null;
  navigate("/confirmation");
}

function orderCard(order) {
  return el("article", {className: "panel", "aria-label": "Order " + order.orderNumber},
    el("p", {className: "muted"}, `Order placed ${new Date(order.date).toLocaleDateString("en-US", {month: "long", day: "numeric", year: "numeric"})}`
      + ` · Total ${money(order.total)} · Ship to ${order.shippingAddress.fullName} · Order # ${order.orderNumber}`),
    el("p", {}, el("strong", {}, "Arriving " + order.delivery.date)),
    el("ul", {}, ...order.items.map(item => el("li", {}, productLink(BY_ID.get(item.id)), ` · Qty: ${item.quantity} · ${money(item.price)}`))));
}

function renderConfirmation(content) {
  document.title = "Omnizon.com: Thank you";
  const orders = app().order.orders;
  if (!orders.length) {
    content.append(el("section", {className: "panel"}, el("h1", {}, "No recent order"), el("a", {href: "/"}, "Continue shopping")));
    return;
  }
  const order = orders[orders.length - 1];
  content.append(el("section", {className: "panel"},
    el("h1", {style: "color: #067d62"}, "Order placed, thank you!"),
    el("p", {}, "Confirmation will be sent to " + app().user.email + "."),
    el("p", {}, "Order number: " + order.orderNumber)),
    orderCard(order),
    el("p", {}, el("a", {href: "/orders"}, "Review or edit your orders"), " · ", el("a", {href: "/"}, "Continue shopping")));
}

function renderOrders(content) {
  document.title = "Your Orders";
  const orders = app().order.orders;
  content.append(el("h1", {}, "Your Orders"));
  if (!orders.length) content.append(el("p", {className: "panel"}, "You have not placed any orders."));
  for (const order of orders.slice().reverse()) content.append(orderCard(order));
}

function renderNotFound(content) {
  document.title = "Page Not Found";
  content.append(el("section", {className: "panel"}, el("h1", {}, "Sorry, we couldn't find that page"),
    el("a", {href: "/"}, "Go to the Omnizon home page")));
}

setUpHeader();
route();
