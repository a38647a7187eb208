#include "prefetcher/chrome_trace.h"

#include "absl/strings/str_format.h"

namespace tierd::prefetcher {
namespace {

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    out += c;
  }
  return out;
}

}  // namespace

std::string ChromeTraceJson(const std::vector<TimelineEvent>& timeline, const std::string& process_name) {
  std::string out = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  out += absl::StrFormat("{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 1, \"args\": {\"name\": \"%s\"}}",
                         Escape(process_name));
  for (Track track : {Track::kCompute, Track::kH2D, Track::kD2H, Track::kNvme}) {
    out += absl::StrFormat(",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": %d, \"args\": {\"name\": \"%s\"}}",
                           static_cast<int>(track), TrackName(track));
  }
  for (const TimelineEvent& e : timeline) {
    out += absl::StrFormat(
        ",\n{\"name\": \"%s\", \"ph\": \"X\", \"pid\": 1, \"tid\": %d, \"ts\": %.3f, \"dur\": %.3f, \"args\": "
        "{\"iteration\": %d, \"op\": %d, \"bytes\": %d}}",
        Escape(e.name), static_cast<int>(e.track), e.start * 1e6, (e.end - e.start) * 1e6, e.iteration, e.op, e.bytes);
  }
  out += "\n]}\n";
  return out;
}

}  // namespace tierd::prefetcher
