#pragma once
// A kvq file's root as HDF5's own API sees it (not kvq's reader): the version attribute and the
// text `name` — as a root attribute, or as a root dataset (its bytes, rank and element size).
#include <H5Cpp.h>

#include <cstdint>
#include <string>

namespace kvq::test {

struct RootText {
  int64_t version = -1;
  bool attr = false;     // a root attribute `name` exists
  std::string dataset;   // the root dataset `name`'s bytes (empty when absent)
  int rank = -1;         // its rank (-1 when absent)
  size_t elem = 0;       // its element size in bytes
  H5T_class_t cls = H5T_NO_CLASS;
};

inline RootText read_root_text_raw(const std::string& path, const std::string& name) {
  H5::Exception::dontPrint();
  RootText out;
  H5::H5File f(path, H5F_ACC_RDONLY);
  H5::Group root = f.openGroup("/");
  root.openAttribute("version").read(H5::PredType::NATIVE_INT64, &out.version);
  out.attr = root.attrExists(name);
  if (H5Lexists(root.getId(), name.c_str(), H5P_DEFAULT) > 0) {
    H5::DataSet ds = root.openDataSet(name);
    out.cls = ds.getTypeClass();
    out.elem = ds.getDataType().getSize();
    H5::DataSpace sp = ds.getSpace();
    out.rank = sp.getSimpleExtentNdims();
    out.dataset.resize(size_t(sp.getSimpleExtentNpoints()));
    ds.read(out.dataset.data(), H5::PredType::NATIVE_UINT8);
  }
  return out;
}

}  // namespace kvq::test
