# Sourced by run-main.sh and run-tests.sh (from the checkout's root): installs
# the Debian 12 packages the build needs that are missing, then configures
# build/ as a release build (reconfiguring it if it exists) and builds it.
# libopenmpi-dev and openmpi-bin: the MPI layer (tapegrad/dist.h) and its
# test, which need MPI present before `meson setup` (-Dmpi=auto finds it).
packages=(meson ninja-build pkg-config gcc libc6-dev python3
          libcriterion-dev libopenblas-dev libjemalloc-dev zlib1g-dev libjansson-dev
          libopenmpi-dev openmpi-bin)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update
    apt-get install -y "${missing[@]}"
fi

if [ -f build/build.ninja ]; then
    meson setup --reconfigure build --buildtype=release
else
    meson setup build --buildtype=release
fi
ninja -C build
