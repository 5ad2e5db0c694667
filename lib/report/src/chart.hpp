#pragma once
// A small chart layer over cairo: panels with linear or log axes, automatic ticks, bars, lines,
// markers, legends and text. Every figure is drawn by one routine and rendered twice, to PNG and
// to SVG, so both files always show the same thing. Internal to kvq_report.
#include <cairo.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace kvq::report::chart {

struct Color {
  double r = 0, g = 0, b = 0, a = 1;
};
inline constexpr Color kBlack{0, 0, 0, 1};
inline constexpr Color kGrid{0.88, 0.88, 0.88, 1};
inline constexpr Color kBlue{0.12, 0.40, 0.70, 1};
inline constexpr Color kOrange{0.90, 0.45, 0.05, 1};
inline constexpr Color kGrey{0.55, 0.55, 0.55, 1};
inline constexpr Color kDarkGrey{0.30, 0.30, 0.30, 1};

// Bit-width colour: 1 b red -> 8 b green (ColorBrewer RdYlGn, 8 classes); 0 b (dimension not
// stored) light grey; above 8 b dark teal.
Color width_color(int bits);

struct Axis {
  double lo = 0, hi = 1;
  bool log = false;
  std::string label;
  std::vector<std::pair<double, std::string>> ticks;  // empty: automatic
  bool integer = false;                               // automatic ticks at integers only
};

enum class Mark { kBox, kLine, kDashed, kDot, kHollowDot, kSquare };
struct LegendEntry {
  std::string text;
  Color color;
  Mark mark = Mark::kBox;
  bool faded = false;  // drawn pale: a scale entry that does not occur in the data
};

enum class Corner { kTopRight, kTopLeft, kBottomLeft, kBottomRight, kOutsideRight };

// Text at pixel (x, y); ha/va: 0 = left/top, 0.5 = centre, 1 = right/bottom; angle in radians.
void text(cairo_t* cr, double x, double y, const std::string& s, double size, double ha = 0, double va = 0,
          bool bold = false, double angle = 0, Color c = kBlack);
double text_width(cairo_t* cr, const std::string& s, double size, bool bold = false);

// One plot area inside the pixel rectangle (x, y, w, h); margins leave room for ticks and labels
// (`right` grows for a right axis or an outside legend).
class Panel {
 public:
  Panel(cairo_t* cr, double x, double y, double w, double h, double right = 24);

  void x_axis(Axis a) { x_ = std::move(a); }
  void y_axis(Axis a) { y_ = std::move(a); }
  void y2_axis(Axis a) { y2_ = std::move(a); has_y2_ = true; }

  double X(double v) const;
  double Y(double v) const;
  double Y2(double v) const;

  // Grid, frame, ticks, tick labels, axis labels and the title above the plot area.
  void frame(const std::string& title, const std::string& subtitle = "");

  // Data-coordinate primitives, clipped to the plot area.
  void bar(double x0, double x1, double y0, double y1, Color fill, bool outline = true);
  void line(const std::vector<double>& xs, const std::vector<double>& ys, Color c, double width = 2,
            bool dashed = false, bool on_y2 = false);
  void steps(const std::vector<double>& xs, const std::vector<double>& ys, double half_width, Color c,
             double width = 2, bool on_y2 = false);  // horizontal segment per point
  void marker(double x, double y, Color c, double radius = 4, Mark m = Mark::kDot, bool on_y2 = false);
  void vline(double x, Color c, double width = 1.5, bool dashed = true);
  void hline(double y, Color c, double width = 1.5, bool dashed = true);
  void label(double x, double y, const std::string& s, double size = 11, double ha = 0.5, double va = 1,
             Color c = kBlack, bool on_y2 = false);

  void legend(const std::vector<LegendEntry>& entries, Corner where = Corner::kTopRight, const std::string& title = "");

  double left() const { return ax_; }
  double top() const { return ay_; }
  double width() const { return aw_; }
  double height() const { return ah_; }

 private:
  void clip_begin() const;
  void clip_end() const;
  cairo_t* cr_;
  double ax_, ay_, aw_, ah_;
  Axis x_, y_, y2_;
  bool has_y2_ = false;
};

// Automatic tick positions and labels for an axis.
std::vector<std::pair<double, std::string>> auto_ticks(const Axis& a, int target = 6);

// Draws `draw(cr)` on a white width x height canvas and writes stem + ".png" and stem + ".svg",
// each atomically. Throws kvq::Error naming the file on any cairo failure.
void render(const std::string& stem, int width, int height, const std::function<void(cairo_t*)>& draw);

}  // namespace kvq::report::chart
