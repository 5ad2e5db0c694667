#include "chart.hpp"

#include <cairo-svg.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "kvq/util/atomic_file.hpp"
#include "kvq/util/error.hpp"

namespace kvq::report::chart {
namespace {

// DejaVu ships with fontconfig on Debian (fonts-dejavu-core); cairo falls back to any sans face.
constexpr const char* kFont = "DejaVu Sans";

void set_color(cairo_t* cr, Color c) { cairo_set_source_rgba(cr, c.r, c.g, c.b, c.a); }

// Strokes the current path in `c`, solid or (dash_on > 0) dashed dash_on/dash_off.
void stroke(cairo_t* cr, Color c, double width, double dash_on = 0, double dash_off = 0) {
  set_color(cr, c);
  cairo_set_line_width(cr, width);
  if (dash_on > 0) {
    const double d[] = {dash_on, dash_off};
    cairo_set_dash(cr, d, 2, 0);
  }
  cairo_stroke(cr);
  cairo_set_dash(cr, nullptr, 0, 0);
}

void set_font(cairo_t* cr, double size, bool bold) {
  cairo_select_font_face(cr, kFont, CAIRO_FONT_SLANT_NORMAL, bold ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
  cairo_set_font_size(cr, size);
}

std::string fmt_fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  std::string s = buf;
  if (s.find_first_not_of("-0.") == std::string::npos) s = "0";  // no "-0" / "0.00"
  return s;
}

std::string fmt_log(double v) {
  char buf[64];
  if (v >= 1e-3 && v < 1e4)
    std::snprintf(buf, sizeof buf, "%g", v);
  else
    std::snprintf(buf, sizeof buf, "%.0e", v);
  return buf;
}

double to_unit(const Axis& a, double v) {
  if (a.log) {
    const double lo = std::log10(a.lo), hi = std::log10(a.hi);
    const double x = std::log10(std::max(v, a.lo * 1e-3));
    return hi > lo ? (x - lo) / (hi - lo) : 0.5;
  }
  return a.hi > a.lo ? (v - a.lo) / (a.hi - a.lo) : 0.5;
}

}  // namespace

Color width_color(int bits) {
  static const Color kRdYlGn[8] = {{0.843, 0.188, 0.153, 1}, {0.957, 0.427, 0.263, 1}, {0.992, 0.682, 0.380, 1},
                                   {0.996, 0.878, 0.545, 1}, {0.851, 0.937, 0.545, 1}, {0.651, 0.851, 0.416, 1},
                                   {0.400, 0.741, 0.388, 1}, {0.102, 0.596, 0.314, 1}};
  if (bits <= 0) return {0.80, 0.80, 0.80, 1};
  if (bits > 8) return {0.0, 0.35, 0.33, 1};
  return kRdYlGn[bits - 1];
}

void text(cairo_t* cr, double x, double y, const std::string& s, double size, double ha, double va, bool bold,
          double angle, Color c) {
  if (s.empty()) return;
  cairo_save(cr);
  set_font(cr, size, bold);
  cairo_text_extents_t te;
  cairo_font_extents_t fe;
  cairo_text_extents(cr, s.c_str(), &te);
  cairo_font_extents(cr, &fe);
  cairo_translate(cr, x, y);
  cairo_rotate(cr, angle);
  const double dx = -ha * te.x_advance;
  const double dy = fe.ascent - va * (fe.ascent + fe.descent);
  cairo_move_to(cr, dx, dy);
  set_color(cr, c);
  cairo_show_text(cr, s.c_str());
  cairo_restore(cr);
}

double text_width(cairo_t* cr, const std::string& s, double size, bool bold) {
  cairo_save(cr);
  set_font(cr, size, bold);
  cairo_text_extents_t te;
  cairo_text_extents(cr, s.c_str(), &te);
  cairo_restore(cr);
  return te.x_advance;
}

std::vector<std::pair<double, std::string>> auto_ticks(const Axis& a, int target) {
  std::vector<std::pair<double, std::string>> t;
  if (!(a.hi > a.lo)) return t;
  if (a.log && a.hi / a.lo < 4) {
    // Less than a factor 4: plain linear-style ticks read better than decades.
    Axis lin = a;
    lin.log = false;
    for (auto& [v, s] : auto_ticks(lin, 5))
      if (v > 0) t.push_back({v, s});
    return t;
  }
  if (a.log) {
    const int k0 = int(std::floor(std::log10(a.lo) + 1e-9)), k1 = int(std::floor(std::log10(a.hi) + 1e-9));
    const int decades = k1 - k0 + 1;
    const int step = std::max(1, (decades + 7) / 8);
    for (int k = k0; k <= k1; k += step) {
      const double base = std::pow(10.0, k);
      const std::vector<double> mult = a.hi / a.lo < 30 ? std::vector<double>{1, 1.5, 2, 3, 5, 7}
                                       : decades <= 3   ? std::vector<double>{1, 2, 5}
                                                        : std::vector<double>{1};
      for (double m : mult) {
        const double v = m * base;
        if (v >= a.lo * (1 - 1e-9) && v <= a.hi * (1 + 1e-9)) t.push_back({v, fmt_log(v)});
      }
    }
    return t;
  }
  const double raw = (a.hi - a.lo) / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  double step = (norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * mag;
  if (a.integer) step = std::max(1.0, std::round(step));
  const int decimals = std::max(0, -int(std::floor(std::log10(step) + 1e-9)));
  for (double v = std::ceil(a.lo / step - 1e-9) * step; v <= a.hi + 1e-9 * step; v += step)
    t.push_back({v, fmt_fixed(v, decimals)});
  return t;
}

Panel::Panel(cairo_t* cr, double x, double y, double w, double h, double right) : cr_(cr) {
  ax_ = x + 78;
  ay_ = y + 52;
  aw_ = std::max(10.0, w - 78 - right);
  ah_ = std::max(10.0, h - 52 - 52);
}

double Panel::X(double v) const { return ax_ + aw_ * to_unit(x_, v); }
double Panel::Y(double v) const { return ay_ + ah_ * (1 - to_unit(y_, v)); }
double Panel::Y2(double v) const { return ay_ + ah_ * (1 - to_unit(y2_, v)); }

void Panel::clip_begin() const {
  cairo_save(cr_);
  cairo_rectangle(cr_, ax_, ay_, aw_, ah_);
  cairo_clip(cr_);
}
void Panel::clip_end() const { cairo_restore(cr_); }

void Panel::frame(const std::string& title, const std::string& subtitle) {
  cairo_save(cr_);
  cairo_set_line_width(cr_, 1);
  const auto xt = x_.ticks.empty() ? auto_ticks(x_) : x_.ticks;
  const auto yt = y_.ticks.empty() ? auto_ticks(y_) : y_.ticks;
  // Grid first, under the data.
  set_color(cr_, kGrid);
  for (const auto& [v, s] : yt) {
    const double py = std::round(Y(v)) + 0.5;
    cairo_move_to(cr_, ax_, py);
    cairo_line_to(cr_, ax_ + aw_, py);
  }
  cairo_stroke(cr_);
  set_color(cr_, kBlack);
  cairo_rectangle(cr_, std::round(ax_) + 0.5, std::round(ay_) + 0.5, std::round(aw_), std::round(ah_));
  cairo_stroke(cr_);
  for (const auto& [v, s] : xt) {
    const double px = std::round(X(v)) + 0.5;
    cairo_move_to(cr_, px, ay_ + ah_);
    cairo_line_to(cr_, px, ay_ + ah_ + 5);
    cairo_stroke(cr_);
    text(cr_, px, ay_ + ah_ + 7, s, 11, 0.5, 0);
  }
  for (const auto& [v, s] : yt) {
    const double py = std::round(Y(v)) + 0.5;
    cairo_move_to(cr_, ax_ - 5, py);
    cairo_line_to(cr_, ax_, py);
    cairo_stroke(cr_);
    text(cr_, ax_ - 7, py, s, 11, 1, 0.5);
  }
  if (has_y2_) {
    const auto y2t = y2_.ticks.empty() ? auto_ticks(y2_) : y2_.ticks;
    for (const auto& [v, s] : y2t) {
      const double py = std::round(Y2(v)) + 0.5;
      cairo_move_to(cr_, ax_ + aw_, py);
      cairo_line_to(cr_, ax_ + aw_ + 5, py);
      cairo_stroke(cr_);
      text(cr_, ax_ + aw_ + 7, py, s, 11, 0, 0.5);
    }
    text(cr_, ax_ + aw_ + 40, ay_ + ah_ / 2, y2_.label, 12, 0.5, 0.5, false, M_PI / 2);
  }
  text(cr_, ax_ + aw_ / 2, ay_ + ah_ + 26, x_.label, 12, 0.5, 0);
  text(cr_, ax_ - 58, ay_ + ah_ / 2, y_.label, 12, 0.5, 0.5, false, -M_PI / 2);
  // Long titles shrink to the panel width rather than run off the canvas.
  const double room = aw_ + 40;
  const double ts = std::max(8.0, std::min(14.0, 14 * room / std::max(1.0, text_width(cr_, title, 14, true))));
  const double ss = std::max(7.0, std::min(11.0, 11 * room / std::max(1.0, text_width(cr_, subtitle, 11))));
  text(cr_, ax_ + aw_ / 2, ay_ - (subtitle.empty() ? 12 : 28), title, ts, 0.5, 1, true);
  if (!subtitle.empty()) text(cr_, ax_ + aw_ / 2, ay_ - 8, subtitle, ss, 0.5, 1, false, 0, kDarkGrey);
  cairo_restore(cr_);
}

void Panel::bar(double x0, double x1, double y0, double y1, Color fill, bool outline) {
  clip_begin();
  const double px0 = X(x0), px1 = X(x1), py0 = Y(y0), py1 = Y(y1);
  cairo_rectangle(cr_, std::min(px0, px1), std::min(py0, py1), std::abs(px1 - px0), std::abs(py1 - py0));
  set_color(cr_, fill);
  if (outline) {
    cairo_fill_preserve(cr_);
    cairo_set_line_width(cr_, 0.6);
    set_color(cr_, {0.2, 0.2, 0.2, 0.8});
    cairo_stroke(cr_);
  } else {
    cairo_fill(cr_);
  }
  clip_end();
}

void Panel::line(const std::vector<double>& xs, const std::vector<double>& ys, Color c, double width, bool dashed,
                 bool on_y2) {
  if (xs.empty()) return;
  clip_begin();
  for (size_t i = 0; i < xs.size() && i < ys.size(); ++i) {
    const double px = X(xs[i]), py = on_y2 ? Y2(ys[i]) : Y(ys[i]);
    if (i == 0)
      cairo_move_to(cr_, px, py);
    else
      cairo_line_to(cr_, px, py);
  }
  cairo_set_line_join(cr_, CAIRO_LINE_JOIN_ROUND);
  stroke(cr_, c, width, dashed ? 6 : 0, 4);
  clip_end();
}

void Panel::steps(const std::vector<double>& xs, const std::vector<double>& ys, double hw, Color c, double width,
                  bool on_y2) {
  std::vector<double> sx, sy;
  for (size_t i = 0; i < xs.size() && i < ys.size(); ++i) {
    sx.push_back(xs[i] - hw);
    sy.push_back(ys[i]);
    sx.push_back(xs[i] + hw);
    sy.push_back(ys[i]);
  }
  line(sx, sy, c, width, false, on_y2);
}

void Panel::marker(double x, double y, Color c, double radius, Mark m, bool on_y2) {
  clip_begin();
  const double px = X(x), py = on_y2 ? Y2(y) : Y(y);
  if (m == Mark::kSquare)
    cairo_rectangle(cr_, px - radius, py - radius, 2 * radius, 2 * radius);
  else
    cairo_arc(cr_, px, py, radius, 0, 2 * M_PI);
  cairo_set_line_width(cr_, 1.5);
  if (m == Mark::kHollowDot) {
    set_color(cr_, {1, 1, 1, 1});
    cairo_fill_preserve(cr_);
    set_color(cr_, c);
    cairo_stroke(cr_);
  } else {
    set_color(cr_, c);
    cairo_fill_preserve(cr_);
    set_color(cr_, {0, 0, 0, 0.6});
    cairo_set_line_width(cr_, 0.8);
    cairo_stroke(cr_);
  }
  clip_end();
}

void Panel::vline(double x, Color c, double width, bool dashed) {
  clip_begin();
  cairo_move_to(cr_, X(x), ay_);
  cairo_line_to(cr_, X(x), ay_ + ah_);
  stroke(cr_, c, width, dashed ? 5 : 0, 4);
  clip_end();
}

void Panel::hline(double y, Color c, double width, bool dashed) {
  clip_begin();
  cairo_move_to(cr_, ax_, Y(y));
  cairo_line_to(cr_, ax_ + aw_, Y(y));
  stroke(cr_, c, width, dashed ? 5 : 0, 4);
  clip_end();
}

void Panel::label(double x, double y, const std::string& s, double size, double ha, double va, Color c, bool on_y2) {
  text(cr_, X(x), on_y2 ? Y2(y) : Y(y), s, size, ha, va, false, 0, c);
}

void Panel::legend(const std::vector<LegendEntry>& entries, Corner where, const std::string& title) {
  if (entries.empty()) return;
  const double size = 11, row = 17, sw = 22, pad = 7;
  double tw = title.empty() ? 0 : text_width(cr_, title, size, true);
  for (const auto& e : entries) tw = std::max(tw, sw + 6 + text_width(cr_, e.text, size));
  const double w = tw + 2 * pad;
  const double h = row * (entries.size() + (title.empty() ? 0 : 1)) + 2 * pad - 3;
  double x = 0, y = 0;
  switch (where) {
    case Corner::kTopRight: x = ax_ + aw_ - w - 8; y = ay_ + 8; break;
    case Corner::kTopLeft: x = ax_ + 8; y = ay_ + 8; break;
    case Corner::kBottomLeft: x = ax_ + 8; y = ay_ + ah_ - h - 8; break;
    case Corner::kBottomRight: x = ax_ + aw_ - w - 8; y = ay_ + ah_ - h - 8; break;
    case Corner::kOutsideRight: x = ax_ + aw_ + 14; y = ay_; break;
  }
  cairo_save(cr_);
  cairo_rectangle(cr_, x, y, w, h);
  set_color(cr_, {1, 1, 1, 0.92});
  cairo_fill_preserve(cr_);
  set_color(cr_, kGrey);
  cairo_set_line_width(cr_, 1);
  cairo_stroke(cr_);
  double cy = y + pad;
  if (!title.empty()) {
    text(cr_, x + pad, cy, title, size, 0, 0, true);
    cy += row;
  }
  for (const auto& e : entries) {
    const double mx = x + pad, my = cy + row / 2 - 2;
    cairo_push_group(cr_);
    set_color(cr_, e.color);
    switch (e.mark) {
      case Mark::kBox:
        cairo_rectangle(cr_, mx, my - 6, sw, 12);
        cairo_fill_preserve(cr_);
        set_color(cr_, {0.2, 0.2, 0.2, 0.8});
        cairo_set_line_width(cr_, 0.6);
        cairo_stroke(cr_);
        break;
      case Mark::kLine:
      case Mark::kDashed:
        cairo_move_to(cr_, mx, my);
        cairo_line_to(cr_, mx + sw, my);
        cairo_set_line_width(cr_, 2.5);
        if (e.mark == Mark::kDashed) {
          const double d[] = {5, 3};
          cairo_set_dash(cr_, d, 2, 0);
        }
        cairo_stroke(cr_);
        cairo_set_dash(cr_, nullptr, 0, 0);
        break;
      case Mark::kDot:
      case Mark::kHollowDot:
      case Mark::kSquare:
        if (e.mark == Mark::kSquare)
          cairo_rectangle(cr_, mx + sw / 2 - 5, my - 5, 10, 10);
        else
          cairo_arc(cr_, mx + sw / 2, my, 5, 0, 2 * M_PI);
        if (e.mark == Mark::kHollowDot) {
          cairo_set_line_width(cr_, 1.5);
          cairo_stroke(cr_);
        } else {
          cairo_fill(cr_);
        }
        break;
    }
    text(cr_, mx + sw + 6, my, e.text, size, 0, 0.5);
    cairo_pop_group_to_source(cr_);
    cairo_paint_with_alpha(cr_, e.faded ? 0.35 : 1.0);
    cy += row;
  }
  cairo_restore(cr_);
}

namespace {

void check(cairo_status_t st, const std::string& path) {
  if (st != CAIRO_STATUS_SUCCESS) throw Error(path, "", std::string("cannot write the plot: ") + cairo_status_to_string(st));
}

void paint(cairo_t* cr, int width, int height, const std::function<void(cairo_t*)>& draw) {
  cairo_set_source_rgb(cr, 1, 1, 1);
  cairo_rectangle(cr, 0, 0, width, height);
  cairo_fill(cr);
  draw(cr);
}

}  // namespace

void render(const std::string& stem, int width, int height, const std::function<void(cairo_t*)>& draw) {
  const std::string png = stem + ".png", svg = stem + ".svg";
  write_atomically(png, [&](const std::string& tmp) {
    cairo_surface_t* s = cairo_image_surface_create(CAIRO_FORMAT_ARGB32, width, height);
    cairo_t* cr = cairo_create(s);
    paint(cr, width, height, draw);
    cairo_status_t st = cairo_status(cr);
    cairo_destroy(cr);
    if (st == CAIRO_STATUS_SUCCESS) st = cairo_surface_write_to_png(s, tmp.c_str());
    cairo_surface_destroy(s);
    check(st, png);
  });
  write_atomically(svg, [&](const std::string& tmp) {
    cairo_surface_t* s = cairo_svg_surface_create(tmp.c_str(), width, height);
    cairo_svg_surface_set_document_unit(s, CAIRO_SVG_UNIT_PX);  // same numbers as the PNG
    cairo_t* cr = cairo_create(s);
    paint(cr, width, height, draw);
    cairo_status_t st = cairo_status(cr);
    cairo_destroy(cr);
    cairo_surface_finish(s);
    if (st == CAIRO_STATUS_SUCCESS) st = cairo_surface_status(s);
    cairo_surface_destroy(s);
    check(st, svg);
  });
}

}  // namespace kvq::report::chart
